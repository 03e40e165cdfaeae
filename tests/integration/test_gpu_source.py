"""Which GPU the daemon reads is the config's choice (`[gpu]`), never the environment's: the
simulator's GPU under `source = "simulator"`, shown in the self-check and the journal; a reload
cannot swap it under running probes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from daemonproc import status
from statedir import named
from waiting import wait

from supervisor.config.render import dump_toml as to_toml
from supervisor.process import kill_marked

pytestmark = pytest.mark.integration


def write_gpu(path: Path, uuid: str) -> Path:
    path.write_text(json.dumps({"devices": [{"uuid": uuid, "util": 7}]}))
    return path


async def test_the_config_hands_the_daemon_the_simulated_gpu_and_the_self_check_says_so(  # type: ignore[no-untyped-def]
    daemon, sim, tmp_path: Path
) -> None:
    chosen = write_gpu(tmp_path / "chosen.json", "GPU-chosen")
    other = write_gpu(tmp_path / "other.json", "GPU-from-env")
    s = sim("ok", tp=1, gpu=chosen)
    env = {**os.environ, "SGLANG_SUPERVISOR_FAKE_NVML": str(other)}  # the old switch: ignored
    r = await daemon(s, env=env)
    snap = await r.wait_for(lambda x: x.gpu.status == "ok", 30, "the simulated GPU read")
    assert [d.uuid for d in snap.gpu.devices] == ["GPU-chosen"]
    async with httpx.AsyncClient(timeout=10) as c:
        checks = (await c.get(f"{r.api}/status")).json()["selfcheck"]
    gpu = [c for c in checks if c["name"] == "gpu"]
    assert len(gpu) == 1 and gpu[0]["ok"] and gpu[0]["detail"].startswith("simulated: the simulator's GPU from ")
    assert str(chosen) in gpu[0]["detail"]
    assert [e["source"] for e in named(s.state_dir, "gpu_scope")] == ["simulator"]


async def test_no_environment_variable_switches_the_daemon_to_a_simulated_gpu(  # type: ignore[no-untyped-def]
    daemon, sim, tmp_path: Path
) -> None:
    nvml = write_gpu(tmp_path / "nvml.json", "GPU-from-env")
    s = sim("ok", tp=1)  # no [gpu]: the real NVML (unavailable on a machine without one)
    env = {**os.environ, "SGLANG_SUPERVISOR_FAKE_NVML": str(nvml), "SGLANG_SIM_GPU_FILE": str(nvml)}
    r = await daemon(s, env=env)
    snap = await r.wait_for(lambda x: x.state == "ready", 40, "ready")
    assert "GPU-from-env" not in [d.uuid for d in snap.gpu.devices]
    assert all(c.name != "gpu" for c in snap.selfcheck)
    assert [e["source"] for e in named(s.state_dir, "gpu_scope")] == ["nvml"]


def test_a_reload_that_changes_the_gpu_source_is_refused_whole(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1, gpu=write_gpu(tmp_path / "nvml.json", "GPU-chosen"))
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "run", "--config", str(cfg)],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        st = wait(lambda: (x := status(api)) and x["state"] == "ready" and x, 60, "ready")
        cfg.write_text(to_toml(s.model_copy(update={"gpu": s.gpu.model_copy(update={"source": "nvml", "file": None})})))
        proc.send_signal(signal.SIGHUP)
        refused = wait(lambda: named(s.state_dir, "config_reload_refused"), 20, "the [gpu] refusal")[0]
        assert "[gpu] changed" in refused["error"] and "restart the daemon" in refused["error"]
        after = status(api)
        assert after is not None and after["pid"] == st["pid"] and after["gpu"]["devices"][0]["uuid"] == "GPU-chosen"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            marker = json.loads((s.state_dir / "state.json").read_text())["marker"]
            kill_marked(marker, grace_s=0.5)
