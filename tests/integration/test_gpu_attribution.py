"""The GPU channel with NVML faked from a file (CI has no GPU): attribution, progress, release checks.

The real NVML is exercised on the H200 (tests/gpu/). Here the fake stands in for the driver only:
the processes, their pids and everything else are real.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from gpufile import GB, write_nvml

pytestmark = pytest.mark.integration
async def test_tree_gpu_memory_is_attributed_and_counts_as_progress(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nvml = tmp_path / "nvml.json"
    write_nvml(nvml, {})
    s = sim("deadlock_after_load", watchdog={"startup_stall_s": 3.0}, gpu=nvml)
    r = await daemon(s)
    snap = await r.wait_for(lambda x: any(p.role == "scheduler" for p in x.processes), 20, "schedulers")
    sched = [p.pid for p in snap.processes if p.role == "scheduler"]
    # The schedulers "load weights onto the GPU" while the tree is otherwise deadlocked: each change
    # of GPU memory held by the tree is progress, so no stall while it keeps growing.
    for step in range(1, 7):
        write_nvml(nvml, {pid: step * 2 * GB for pid in sched}, util=3)
        await r.wait_for(lambda x, n=step: x.gpu.tree_mem_bytes == n * 2 * GB * len(sched), 5, "attribution")
        assert r.snap().last_incident is None
        assert r.snap().state == "starting"
        await asyncio.sleep(1.0)
    st = r.snap()
    assert st.gpu.status == "ok"
    dev = {d.uuid: d for d in st.gpu.devices}
    assert dev["GPU-aaaa"].tree_mem_bytes == 12 * GB * len(sched)
    assert dev["GPU-bbbb"].tree_mem_bytes == 0, "a process outside the tree is not attributed"
    async with httpx.AsyncClient() as c:
        metrics = (await c.get(f"{r.api}/metrics")).text
    assert 'sglang_supervisor_server_gpu_memory_bytes{gpu="0",uuid="GPU-aaaa"}' in metrics
    # Then nothing moves: the stall comes, classified idle (3 % GPU, no CPU).
    snap = await r.wait_for(lambda x: x.last_incident is not None, 20, "the stall")
    assert snap.last_incident is not None and snap.last_incident.hang_class == "idle_deadlock"


@pytest.mark.parametrize("policy,expect", [("fail", "failed"), ("relaunch", "starting")])
async def test_gpu_memory_never_released_follows_the_policy(
    daemon, sim, tmp_path: Path, policy: str, expect: str
) -> None:  # type: ignore[no-untyped-def]
    nvml = tmp_path / "nvml.json"
    write_nvml(nvml, {})
    s = sim(
        "crash_on_load",
        restart={"release_timeout_s": 1.0, "release_policy": policy, "retries_per_rung": 5},
        gpu=nvml,
    )
    r = await daemon(s)
    pid = r.snap().pid
    assert pid is not None
    write_nvml(nvml, {pid: 40 * GB})  # a driver that keeps the dead process's memory
    await r.wait_for(lambda x: x.state == expect and x.last_incident is not None, 30, f"policy {policy}")
    events = [json.loads(x) for x in (Path(s.paths.state_dir) / "events.jsonl").read_text().splitlines()]
    stop = next(e for e in events if e["event"] == "server_stopped")
    assert stop["gpu_released"] is False and stop["gpu_held_bytes"] == 40 * GB and stop["release_wait_s"] >= 1.0
    if policy == "fail":
        assert "release" in r.snap().reason
