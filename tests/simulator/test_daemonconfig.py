"""The one config builder for the daemon over the simulator (demo, bench, tests): what it sets and
what it leaves to the daemon's defaults."""

from __future__ import annotations

from pathlib import Path

from supervisor.config.settings import Settings, load_settings, settings_from_mapping
from supervisor.demo import demo_config
from supervisor.simulator.daemonconfig import SimWindows, sim_config

W = SimWindows(
    poll_s=0.5, startup_stall_s=4.0, startup_timeout_s=60.0, cpu_only_stall_s=8.0, health_interval_s=1.0,
    health_timeout_s=4.0, backoff_initial_s=0.2, backoff_max_s=1.0, stop_grace_s=3.0, release_timeout_s=2.0,
    pace=0.15, health_latency_s=0.05,
)  # fmt: skip


def build(**kw: object) -> Settings:
    base: dict[str, object] = dict(
        scenario="ok", state_dir=Path("/tmp/s"), model_path="/m", server_port=31001, api_port=31002
    )
    return settings_from_mapping(sim_config(W, **{**base, **kw}))  # type: ignore[arg-type]


def test_windows_left_unset_keep_the_daemons_defaults_and_the_simulators() -> None:
    s, d = build(), Settings()
    assert s.watchdog.poll_interval_s == 0.5 and s.watchdog.startup_timeout_s == 60.0
    assert s.watchdog.health_failures == d.watchdog.health_failures
    assert s.watchdog.serving_stall_s == d.watchdog.serving_stall_s
    assert s.restart.max_restarts_per_hour == d.restart.max_restarts_per_hour
    env = {"SGLANG_SIM_SCENARIO": "ok", "SGLANG_SIM_PACE": "0.15", "SGLANG_SIM_HEALTH_LATENCY_S": "0.05"}
    assert s.server.env == env
    assert s.diagnostics.native is False and s.diagnostics.gdb == "never"
    assert s.gpu == d.gpu  # the real NVML unless a simulated GPU file is named


def test_a_gpu_file_is_named_to_the_daemon_and_the_simulator_and_overrides_win() -> None:
    s = build(gpu_file=Path("/tmp/g.json"), env={"SGLANG_SIM_PACE": "0.3"}, watchdog={"poll_interval_s": 0.2}, tp=1)
    assert s.gpu.source == "simulator" and s.gpu.file == "/tmp/g.json"
    assert s.server.env["SGLANG_SIM_GPU_FILE"] == "/tmp/g.json" and s.server.env["SGLANG_SIM_PACE"] == "0.3"
    assert s.watchdog.poll_interval_s == 0.2 and s.server.args["tp-size"] == 1


def test_the_demo_config_is_the_builders_with_the_demo_story(tmp_path: Path) -> None:
    text = demo_config(Path("/tmp/demo"), 31003, 31004)
    (tmp_path / "demo.toml").write_text(text)
    s = load_settings(tmp_path / "demo.toml")
    assert text.startswith("# Written by `sglang-supervisor demo`")
    assert s.server.env["SGLANG_SIM_SCENARIO"] == "deadlock_after_load"
    assert s.server.env["SGLANG_SIM_UNLESS"] == "disable-cuda-graph"
    assert [r.name for r in s.ladder] == ["base", "no-cuda-graph"] and s.watchdog.startup_stall_s == 8.0
    assert s.gpu.source == "simulator" and str(s.paths.state_dir) == "/tmp/demo"
