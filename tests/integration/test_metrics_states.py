"""What a Prometheus scrape of the running daemon says across states: GPU gauges keep following
NVML after a stop, and a manual restart is counted. NVML is faked from a file (CI has no GPU);
the daemon, the simulator's processes, its ports and the HTTP API are real."""

from __future__ import annotations

import asyncio
import json
import os
import platform
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration
GB = 1024**3
GPU = {"gpu": "0", "uuid": "GPU-aaaa"}


def write_nvml(path: Path, processes: dict[int, int]) -> None:
    device = {
        "uuid": "GPU-aaaa",
        "name": "NVIDIA H200",
        "util": 0,
        "processes": {str(p): b for p, b in processes.items()},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": [device]}))
    os.replace(tmp, path)


async def scrape(api: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"{api}/metrics")).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


async def test_gpu_gauges_follow_nvml_after_a_stop(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nvml = tmp_path / "nvml.json"
    write_nvml(nvml, {})
    r = await daemon(sim("ok", gpu=nvml))
    snap = await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    pids = [p.pid for p in snap.processes if p.role == "scheduler"]
    write_nvml(nvml, {pid: 10 * GB for pid in pids})
    await r.wait_for(lambda x: x.gpu.tree_mem_bytes == 10 * GB * len(pids), 10, "attribution")
    held = await scrape(r.api)
    assert held[key("sglang_supervisor_server_gpu_memory_bytes", **GPU)] == 10 * GB * len(pids)

    async with httpx.AsyncClient(timeout=30) as c:
        assert (await c.post(f"{r.api}/stop", json={})).status_code == 202
    write_nvml(nvml, {})  # the driver frees the memory of the dead processes
    await r.wait_for(lambda x: x.state == "stopped", 30, "stopped")
    # A process outside the tree takes memory while the server is stopped: the gauges must see it.
    write_nvml(nvml, {999999: 7 * GB})
    await r.wait_for(
        lambda x: x.gpu.devices and x.gpu.devices[0].mem_used_bytes == 7 * GB, 10, "NVML read while stopped"
    )
    for _ in range(40):  # /metrics is rendered at most once a second (api: ScrapeCache, issue 33)
        m = await scrape(r.api)
        if m[key("sglang_supervisor_gpu_memory_used_bytes", **GPU)] == 7 * GB:
            break
        await asyncio.sleep(0.25)
    assert m[key("sglang_supervisor_gpu_memory_used_bytes", **GPU)] == 7 * GB
    assert m[key("sglang_supervisor_server_gpu_memory_bytes", **GPU)] == 0
    assert m[key("sglang_supervisor_state", state="stopped")] == 1


async def test_a_manual_restart_is_counted_and_every_label_starts_at_zero(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok"))
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    m = await scrape(r.api)
    assert m[key("sglang_supervisor_restarts_total", cause="manual")] == 0
    assert m[key("sglang_supervisor_incidents_total", cause="startup_stall", hang_class="idle_deadlock")] == 0
    assert m[key("sglang_supervisor_incidents_total", cause="exited", hang_class="none")] == 0
    assert m[key("sglang_supervisor_diagnostics_total", outcome="written")] == 0
    assert m[key("sglang_supervisor_build_info", version=r.snap().version, python=platform.python_version())] == 1
    assert m[key("sglang_supervisor_selfcheck_ok", tool="ptrace")] in (0, 1)
    async with httpx.AsyncClient(timeout=30) as c:
        assert (await c.post(f"{r.api}/restart", json={"reason": "test"})).status_code == 202
    await r.wait_for(lambda x: x.last_incident is not None and x.state == "ready", 60, "ready again")
    m = await scrape(r.api)
    assert m[key("sglang_supervisor_restarts_total", cause="manual")] == 1
    assert m[key("sglang_supervisor_incidents_total", cause="manual", hang_class="none")] == 1
