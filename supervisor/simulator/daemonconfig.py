"""The daemon's configuration for supervising the built-in simulator, with short windows.

One builder for everything that runs the daemon over the simulator: `sglang-supervisor demo`, the
CPU benchmarks (bench/common.py) and the integration tests (tests/support/simconfig.py). Each keeps
its own windows (`SimWindows`); the shape of the config (the simulator's command, its environment
knobs, the rung's arguments, no native or gdb capture, the simulator's GPU) is written here once.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, kw_only=True)
class SimWindows:
    """How quickly the daemon judges and how fast the simulator runs. A None leaves the daemon's
    (or the simulator's) default; production windows are minutes long, these are seconds."""

    # [watchdog]
    poll_s: float
    startup_stall_s: float
    startup_timeout_s: float
    cpu_only_stall_s: float
    health_interval_s: float
    health_timeout_s: float
    health_failures: int | None = None
    serving_stall_s: float | None = None
    metrics_interval_s: float | None = None
    spec_window_s: float | None = None
    # [restart]
    backoff_initial_s: float
    backoff_max_s: float
    stop_grace_s: float
    release_timeout_s: float
    max_restarts_per_hour: int | None = None
    # [diagnostics]
    py_spy_timeout_s: float | None = None
    # the simulator (its environment)
    pace: float  # SGLANG_SIM_PACE: this fraction of SGLang's start-up pauses
    health_latency_s: float  # a healthy /health answers after this long
    fault_after_s: float | None = None  # a serving fault begins this long after the ready line
    sglang_health_timeout_s: float | None = None  # SGLANG_HEALTH_CHECK_TIMEOUT (20 s in SGLang)
    idle_metrics_s: float | None = None  # idle gauges republished this often (30 s in SGLang)


def _set(pairs: Sequence[tuple[str, object]]) -> dict[str, Any]:
    return {k: v for k, v in pairs if v is not None}


def sim_env(
    scenario: str, w: SimWindows, *, gpu_file: Path | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The simulator's environment: its scenario and pace, the simulated GPU's file, then `extra`."""
    knobs = (
        ("SGLANG_SIM_SCENARIO", scenario),
        ("SGLANG_SIM_PACE", w.pace),
        ("SGLANG_SIM_HEALTH_LATENCY_S", w.health_latency_s),
        ("SGLANG_SIM_FAULT_AFTER_S", w.fault_after_s),
        ("SGLANG_HEALTH_CHECK_TIMEOUT", w.sglang_health_timeout_s),
        ("SGLANG_SIM_IDLE_METRICS_S", w.idle_metrics_s),
        ("SGLANG_SIM_GPU_FILE", gpu_file),
    )
    env = {k: str(v) for k, v in _set(knobs).items()}
    env.update(extra or {})
    return env


def sim_config(
    w: SimWindows,
    *,
    scenario: str,
    state_dir: Path,
    model_path: str,
    server_port: int,
    api_port: int,
    tp: int = 2,
    env: Mapping[str, str] | None = None,
    args: Mapping[str, Any] | None = None,
    fallback: Sequence[Mapping[str, Any]] | None = None,
    watchdog: Mapping[str, Any] | None = None,
    restart: Mapping[str, Any] | None = None,
    diagnostics: Mapping[str, Any] | None = None,
    api: Mapping[str, Any] | None = None,
    gpu_file: Path | None = None,
) -> dict[str, Any]:
    """The config mapping (what `settings_from_mapping` reads, or a TOML file holds) for the
    simulator in `scenario` with windows `w`. `gpu_file`: the simulated GPU's JSON file, which the
    daemon reads (`[gpu] source = "simulator"`) and the simulator writes; None: the real NVML.
    `env`, `args`, `watchdog`, `restart`, `diagnostics`, `api` add to or override their section."""
    data: dict[str, Any] = {
        "server": {
            "command": [sys.executable, "-m", "supervisor.simulator"],
            "port": server_port,
            "env": sim_env(scenario, w, gpu_file=gpu_file, extra=env),
            "args": {"model-path": model_path, "tp-size": tp, "enable-metrics": True, **(args or {})},
        },
        "fallback": [dict(rung) for rung in fallback or ()],
        "watchdog": {
            **_set(
                (
                    ("poll_interval_s", w.poll_s),
                    ("startup_stall_s", w.startup_stall_s),
                    ("startup_timeout_s", w.startup_timeout_s),
                    ("cpu_only_stall_s", w.cpu_only_stall_s),
                    ("health_interval_s", w.health_interval_s),
                    ("health_timeout_s", w.health_timeout_s),
                    ("health_failures", w.health_failures),
                    ("serving_stall_s", w.serving_stall_s),
                    ("metrics_interval_s", w.metrics_interval_s),
                    ("spec_window_s", w.spec_window_s),
                )
            ),
            **(watchdog or {}),
        },
        "restart": {
            **_set(
                (
                    ("retries_per_rung", 0),
                    ("backoff_initial_s", w.backoff_initial_s),
                    ("backoff_max_s", w.backoff_max_s),
                    ("max_restarts_per_hour", w.max_restarts_per_hour),
                    ("stop_grace_s", w.stop_grace_s),
                    ("release_timeout_s", w.release_timeout_s),
                    ("start_from", "preferred"),
                )
            ),
            **(restart or {}),
        },
        "diagnostics": {
            **_set((("native", False), ("gdb", "never"), ("py_spy_timeout_s", w.py_spy_timeout_s))),
            **(diagnostics or {}),
        },
        "api": {"port": api_port, **(api or {})},
        "paths": {"state_dir": str(state_dir)},
    }
    if gpu_file is not None:
        data["gpu"] = {"source": "simulator", "file": str(gpu_file)}
    return data


def vllm_command() -> list[str]:
    """The simulator speaking vLLM (docs/SIMULATOR_VLLM.md)."""
    return [sys.executable, "-m", "supervisor.simulator", "--engine", "vllm"]


def vllm_server(server: Mapping[str, Any], tp: int, args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`sim_config`'s `[server]` as vLLM: its engine, command and its own flags (metrics always on)."""
    own = {"model": server["args"]["model-path"], "tensor-parallel-size": tp, **(args or {})}
    return {**server, "engine": "vllm", "command": vllm_command(), "args": own}


def vllm_rung(name: str, model: str, tp: int, **args: Any) -> dict[str, Any]:
    """A `[[fallback]]` rung that crosses to the simulator's vLLM (its own empty set of arguments)."""
    return {
        "name": name,
        "engine": "vllm",
        "command": vllm_command(),
        "args": {"model": model, "tensor-parallel-size": tp, **args},
    }
