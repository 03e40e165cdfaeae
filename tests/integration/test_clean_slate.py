"""The clean slate through the running daemon: shm segments a SIGKILLed simulator left, a stranger
holding GPU memory (the fake NVML lists a real process), an orphan of an earlier server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from orphans import spawn_orphan
from serving import ready

from supervisor.config.slate import SlateSettings

pytestmark = pytest.mark.integration


def events(r) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    path = Path(r.settings.paths.state_dir) / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_shm_a_killed_server_left_is_removed_before_the_relaunch(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shm = tmp_path / "shm"
    shm.mkdir()
    s = sim("ok", tp=2, env={"SGLANG_SIM_SHM_DIR": str(shm)}, restart={"retries_per_rung": 2, "shm_dir": str(shm)})
    r = await daemon(s)
    snap = await r.wait_for(ready, 40, "ready")
    first = sorted(p.name for p in shm.iterdir())
    ranks = sorted(p.pid for p in snap.processes if p.role == "scheduler")
    assert first == sorted(f for f in first if f.startswith("sgl_shm_mq_")) and len(first) == 2
    assert {int(n.split("_")[3]) for n in first} == set(ranks)  # each named by its creator
    for p in snap.processes:  # the whole tree at once, as a SIGKILL from outside would
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
    snap = await r.wait_for(lambda x: x.state == "ready" and x.restarts >= 1, 60, "relaunched")
    now = sorted(p.name for p in shm.iterdir())
    assert not set(first) & set(now) and len(now) == 2, (first, now)
    (slate,) = [e for e in events(r) if e["event"] == "clean_slate"]
    assert sorted(n.split(" ")[0] for n in slate["shm_removed"]) == first  # type: ignore[union-attr]
    assert all("creator pid" in n for n in slate["shm_removed"])  # type: ignore[union-attr]


async def test_a_stranger_on_the_gpu_refuses_the_launch_until_it_is_gone(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Under `[slate] gpu_strangers = "wait"` (the default judges by need: test_gpu_strangers.py)."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"devices": [{"uuid": "GPU-aaaa", "processes": {str(stranger.pid): 8 * 2**30}}]}))
    try:
        s = sim("ok", tp=1, restart={"backoff_initial_s": 0.5, "backoff_max_s": 1.0}, gpu=nvml)
        s = s.model_copy(update={"slate": SlateSettings(gpu_strangers="wait")})
        r = await daemon(s)
        snap = await r.wait_for(lambda x: 'gpu_strangers = "wait"' in x.reason, 20, "the refusal")
        assert snap.state == "restarting" and snap.pid is None
        assert f"pid {stranger.pid} ({sys.executable} -c import time" in snap.reason and "GPU 0: " in snap.reason
        refusals = [e for e in events(r) if e["event"] == "launch_refused"]
        assert refusals and "8.0 GiB" in str(refusals[0]["gpu"])
        metrics = await asyncio.to_thread(lambda: httpx.get(f"{r.api}/metrics", timeout=5).text)
        series = 'sglang_supervisor_launches_refused_total{reason="gpu_held"}'
        counted = next(x for x in metrics.splitlines() if x.startswith(series))
        assert float(counted.rsplit(" ", 1)[1]) >= 1  # counted like a held port
        assert stranger.poll() is None  # a stranger is never signalled
    finally:
        stranger.kill()
        stranger.wait()
    tmp = nvml.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": [{"uuid": "GPU-aaaa"}]}))
    os.replace(tmp, nvml)
    await r.wait_for(ready, 40, "launched once the GPU is free")


async def test_an_orphan_of_an_earlier_server_is_stopped_before_the_first_launch(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    logs = Path(s.paths.state_dir) / "logs"
    logs.mkdir(parents=True)
    orphan = spawn_orphan(logs / "server.log")
    try:
        r = await daemon(s)
        await r.wait_for(ready, 40, "ready")
        (slate,) = [e for e in events(r) if e["event"] == "clean_slate"]
        assert slate["orphans_found"] == [orphan] and slate["orphans_survivors"] == []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and Path(f"/proc/{orphan}").exists():
            stat = Path(f"/proc/{orphan}/stat").read_text() if Path(f"/proc/{orphan}/stat").exists() else ""
            if ") Z " in stat:
                break
            time.sleep(0.05)
        assert not Path(f"/proc/{orphan}").exists() or ") Z " in Path(f"/proc/{orphan}/stat").read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)
