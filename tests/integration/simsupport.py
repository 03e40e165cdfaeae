"""Config builders shared by the integration tests (importable: pytest puts this folder on sys.path)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from freeport import free_port

from supervisor.config.settings import Settings, settings_from_mapping


def sim_settings(
    tmp_path: Path,
    scenario: str = "ok",
    *,
    tp: int = 2,
    env: dict[str, str] | None = None,
    args: dict[str, Any] | None = None,
    fallback: list[dict[str, Any]] | None = None,
    watchdog: dict[str, Any] | None = None,
    restart: dict[str, Any] | None = None,
    diagnostics: dict[str, Any] | None = None,
    api: dict[str, Any] | None = None,
    gpu: Path | None = None,
) -> Settings:
    """`gpu`: the simulated GPU's JSON file, which the daemon reads (`[gpu] source = "simulator"`) and
    the simulator writes (its `SGLANG_SIM_GPU_FILE`); None: the daemon reads the real NVML."""
    sim_env = {
        "SGLANG_SIM_SCENARIO": scenario,
        "SGLANG_SIM_PACE": "0.15",
        "SGLANG_SIM_HEALTH_LATENCY_S": "0.05",
        # After the ready line, not after the daemon's `ready`: that needs a health answer too (a poll
        # or two later, more on a loaded machine), and a serving fault must begin after it.
        "SGLANG_SIM_FAULT_AFTER_S": "2.5",
        "SGLANG_HEALTH_CHECK_TIMEOUT": "2",
        # SGLang republishes its gauges every 30 s when idle; production's serving_stall_s (60 s)
        # is longer than that, and the tests keep the same ratio with shorter times.
        "SGLANG_SIM_IDLE_METRICS_S": "1.5",
    }
    if gpu is not None:
        sim_env["SGLANG_SIM_GPU_FILE"] = str(gpu)
    sim_env.update(env or {})
    data: dict[str, Any] = {
        "server": {
            "command": [sys.executable, "-m", "supervisor.simulator"],
            "port": free_port(),
            "env": sim_env,
            "args": {"model-path": str(tmp_path / "model"), "tp-size": tp, "enable-metrics": True, **(args or {})},
        },
        "fallback": fallback or [],
        "watchdog": {
            "poll_interval_s": 0.5,
            "startup_stall_s": 4.0,
            "startup_timeout_s": 120.0,
            "cpu_only_stall_s": 8.0,
            "health_interval_s": 1.0,
            "health_timeout_s": 4.0,
            "health_failures": 2,
            "serving_stall_s": 4.0,
            "metrics_interval_s": 0.5,
            "spec_window_s": 4.0,
            **(watchdog or {}),
        },
        "restart": {
            "retries_per_rung": 0,
            "backoff_initial_s": 0.2,
            "backoff_max_s": 2.0,
            "stop_grace_s": 3.0,
            "release_timeout_s": 2.0,
            "start_from": "preferred",
            **(restart or {}),
        },
        "diagnostics": {"native": False, "gdb": "never", "py_spy_timeout_s": 10.0, **(diagnostics or {})},
        "api": {"port": free_port(), **(api or {})},
        "paths": {"state_dir": str(tmp_path / "state")},
    }
    if gpu is not None:
        data["gpu"] = {"source": "simulator", "file": str(gpu)}
    return settings_from_mapping(data)
