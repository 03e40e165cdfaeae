"""Two servers on one host, one daemon each, each scoped to its GPUs by CUDA_VISIBLE_DEVICES: a
stopped daemon does not see its running neighbour's memory (SGLangGpuMemoryUsedWhileStopped stays
quiet), and the neighbour's daemon attributes its own. NVML is faked from a file; the rest is real."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import httpx
import pytest
from daemonproc import cleanup, start, wait_status
from prometheus_client.parser import text_string_to_metric_families

from supervisor.config.render import dump_toml as to_toml

pytestmark = pytest.mark.integration
GB = 1024**3


def write_nvml(path: Path, held: dict[int, dict[int, int]]) -> None:
    """`held`: GPU index -> {pid: bytes}, on a host of four GPUs."""
    doc = {
        "devices": [
            {"uuid": f"GPU-{i}{i}{i}{i}", "processes": {str(p): b for p, b in held.get(i, {}).items()}}
            for i in range(4)
        ]
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def gpu_samples(text: str, name: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}


async def test_each_daemon_sees_only_its_servers_gpus(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nvml = tmp_path / "nvml.json"
    write_nvml(nvml, {})
    env = dict(os.environ)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = sim("ok", tp=1, env={"CUDA_VISIBLE_DEVICES": "0,1"}, gpu=nvml)  # from [server] env
    a = a.model_copy(update={"paths": a.paths.model_copy(update={"state_dir": str(tmp_path / "a")})})
    b = sim("ok", tp=1, gpu=nvml)
    b = b.model_copy(update={"paths": b.paths.model_copy(update={"state_dir": str(tmp_path / "b")})})
    cfg_b = tmp_path / "b.toml"
    cfg_b.write_text(to_toml(b))
    # Daemon B in a process of its own, as on a real host (two daemons in one process would share
    # one subreaper, and each would take the other's server for an orphan of its own).
    proc_b = start(cfg_b, {**env, "CUDA_VISIBLE_DEVICES": "GPU-2222,GPU-3333"})  # from the daemon's environment
    try:
        ra = await daemon(a, env=env)
        await ra.wait_for(lambda x: x.state == "ready", 40, "server A ready")
        api_b = f"http://127.0.0.1:{b.api.port}"
        status_b = await asyncio.to_thread(wait_status, api_b, lambda x: x["state"] == "ready", 40, proc_b)
        pid_b = status_b["pid"]
        async with httpx.AsyncClient(timeout=10) as c:
            assert (await c.post(f"{ra.api}/stop", json={})).status_code == 202
            await ra.wait_for(lambda x: x.state == "stopped", 30, "server A stopped")
            write_nvml(nvml, {2: {pid_b: 60 * GB}, 3: {pid_b: 60 * GB}})  # B's server holds its GPUs
            await asyncio.to_thread(wait_status, api_b, lambda x: x["gpu"]["tree_mem_bytes"] == 120 * GB, 10, proc_b)
            await ra.wait_for(lambda x: x.gpu.status == "ok" and len(x.gpu.devices) == 2, 10, "A probes its GPUs")
            ma = (await c.get(f"{ra.api}/metrics")).text
            mb = (await c.get(f"{api_b}/metrics")).text
    finally:
        proc_b.send_signal(signal.SIGTERM)
        try:
            proc_b.wait(30)
        finally:
            cleanup(proc_b, str(tmp_path / "b"))
    used_a = gpu_samples(ma, "sglang_supervisor_gpu_memory_used_bytes")
    assert used_a == {"0": 0.0, "1": 0.0}, "A's gauges hold only GPUs 0 and 1, which nobody uses"
    assert gpu_samples(mb, "sglang_supervisor_gpu_memory_used_bytes") == {"2": 60.0 * GB, "3": 60.0 * GB}
    assert gpu_samples(mb, "sglang_supervisor_server_gpu_memory_bytes") == {"2": 60.0 * GB, "3": 60.0 * GB}
    assert ra.snap().state == "stopped" and sum(used_a.values()) < 4 * GB  # the alert's threshold
    scope_a = [json.loads(x) for x in (tmp_path / "a" / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "gpu_scope" and e["gpus"] == "CUDA_VISIBLE_DEVICES=0,1" for e in scope_a)
