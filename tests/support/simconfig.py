"""The integration tests' config for the simulator: the product's builder
(supervisor.simulator.daemonconfig) with the tests' windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from freeport import free_port

from supervisor.config.settings import Settings, settings_from_mapping
from supervisor.simulator.daemonconfig import SimWindows, sim_config, vllm_rung, vllm_server

TEST_WINDOWS = SimWindows(
    poll_s=0.5,
    startup_stall_s=4.0,
    startup_timeout_s=120.0,
    cpu_only_stall_s=8.0,
    health_interval_s=1.0,
    health_timeout_s=4.0,
    health_failures=2,
    serving_stall_s=4.0,
    metrics_interval_s=0.5,
    spec_window_s=4.0,
    backoff_initial_s=0.2,
    backoff_max_s=2.0,
    stop_grace_s=3.0,
    release_timeout_s=2.0,
    py_spy_timeout_s=10.0,
    pace=0.15,
    health_latency_s=0.05,
    # After the ready line, not after the daemon's `ready`: that needs a health answer too (a poll
    # or two later, more on a loaded machine), and a serving fault must begin after it.
    fault_after_s=2.5,
    sglang_health_timeout_s=2,
    # SGLang republishes its gauges every 30 s when idle; production's serving_stall_s (60 s)
    # is longer than that, and the tests keep the same ratio with shorter times.
    idle_metrics_s=1.5,
)


# `[restart]` for tests that judge one incident: no retry, a relaunch at once, no hourly limit in reach.
QUICK_RESTART = {
    "retries_per_rung": 0,
    "backoff_initial_s": 0.1,
    "backoff_max_s": 0.2,
    "backoff_jitter": 0.0,
    "max_restarts_per_hour": 50,
}


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
    engine: str = "sglang",
) -> Settings:
    """`gpu`: the simulated GPU's JSON file, which the daemon reads (`[gpu] source = "simulator"`) and
    the simulator writes (its `SGLANG_SIM_GPU_FILE`); None: the daemon reads the real NVML.
    `engine="vllm"`: the base configuration runs the simulator's vLLM (`--engine vllm`, vLLM's flags)."""
    data = sim_config(
        TEST_WINDOWS,
        scenario=scenario,
        state_dir=tmp_path / "state",
        model_path=str(tmp_path / "model"),
        server_port=free_port(),
        api_port=free_port(),
        tp=tp,
        env=env,
        args=args,
        fallback=fallback,
        watchdog=watchdog,
        restart=restart,
        diagnostics=diagnostics,
        api=api,
        gpu_file=gpu,
    )
    if engine == "vllm":
        data["server"] = vllm_server(data["server"], tp, args)
    return settings_from_mapping(data)


__all__ = ["TEST_WINDOWS", "sim_settings", "vllm_rung"]
