"""The same hangs without the daemon: the daemon's own capture timed with and without cuda-gdb on one
hung process, then SIGKILL and the time until NVML shows the GPU memory free."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.gpuserver.harness import ROOT, RunConfig, free_port, server_env, wait_file
from bench.gpuserver.measure import alive, device_used, find_gdb, find_py_spy, wait_released
from probes.gpu import GpuProbe
from probes.proctree import ProcessTreeProbe
from supervisor.diagnostics import CaptureRequest, capture, parse_cuda_kernels
from supervisor.process import resume_stopped
from supervisor.root.gpusource import open_nvml


@dataclass
class DirectResult:
    mode: str
    status: dict[str, Any]
    bundle_s_without_gdb: float
    bundle_s_with_gdb: float
    class_without_gdb: str
    class_with_gdb: str
    tools: list[dict[str, Any]]  # of the capture with gdb
    kernels: tuple[str, ...]
    util_percent: float
    tree_cpu_cores: float
    kill_to_dead_s: float | None
    kill_to_release_s: float | None
    baseline_bytes: int | None
    device_after_bytes: int | None


async def run_direct(work: Path, mode: str, rc: RunConfig) -> DirectResult:
    """Hang the server without the daemon, run the daemon's capture twice (without, then with gdb), SIGKILL it."""
    work.mkdir(parents=True, exist_ok=True)
    probe = GpuProbe(open_nvml(rc.gpu))
    baseline = device_used(probe)
    status_file = work / "status.json"
    env = {**os.environ, **server_env(mode, status_file, rc), "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable,
        "-m",
        "bench.gpuserver.server",
        "--model-path",
        "/models/gpu-bench",
        "--port",
        str(free_port()),
    ]
    with open(work / "server.log", "wb") as out:
        root = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    pids: list[int] = [root.pid]
    try:
        status = await wait_file(status_file, lambda d: d.get("onset_wall") is not None, rc.ready_timeout_s)
        pids.append(int(status["scheduler_pid"]))
        tree_probe = ProcessTreeProbe()
        first = await asyncio.to_thread(tree_probe.observe, root.pid, None)
        await asyncio.sleep(1.0)  # let the hang settle (threads parked, the kernel resident); measure the CPU
        tree = await asyncio.to_thread(tree_probe.observe, root.pid, None)
        cores = (tree.cpu_time_s - first.cpu_time_s) / 1.0
        gpu = await asyncio.to_thread(probe.observe, pids)
        util = gpu.max_util_percent if gpu.status == "ok" else 0.0
        results = []
        for with_gdb in (False, True):
            req = CaptureRequest(
                incident_id=f"direct-{mode}-{'gdb' if with_gdb else 'nogdb'}",
                trigger="hung",
                cause="startup_stall",
                processes=tree.processes,
                native=True,
                gdb=with_gdb,
                py_spy_timeout_s=rc.py_spy_timeout_s,
                gdb_timeout_s=rc.gdb_timeout_s,
                gpu=await asyncio.to_thread(probe.snapshot_all),
                gpu_util_percent=util if gpu.status == "ok" else None,
                tree_cpu_cores=cores,
            )
            results.append(
                await capture(
                    req,
                    work / "diagnostics",
                    keep=10,
                    max_bytes=1 << 30,
                    py_spy_path=find_py_spy(),
                    gdb_path=find_gdb(),
                    resume=resume_stopped,
                )
            )
        plain, full = results
        sched = int(status["scheduler_pid"])
        gdb_file = (full.path / f"gdb-{sched}.txt") if full.path else None
        kernels = parse_cuda_kernels(gdb_file.read_text(errors="replace")) if gdb_file and gdb_file.exists() else ()
        t0 = time.monotonic()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        dead = await asyncio.to_thread(_wait_dead, root, pids, 30.0)
        freed = await asyncio.to_thread(wait_released, probe, pids, baseline, 60.0)
        release = (time.monotonic() - t0) if freed is not None else None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(root.pid, signal.SIGKILL)
        root.wait(30)
    result = DirectResult(
        mode=mode,
        status=status,
        bundle_s_without_gdb=plain.duration_s,
        bundle_s_with_gdb=full.duration_s,
        class_without_gdb=plain.hang_class,
        class_with_gdb=full.hang_class,
        tools=[asdict(t) for t in full.tools],
        kernels=kernels,
        util_percent=util,
        tree_cpu_cores=cores,
        kill_to_dead_s=(dead - t0) if dead is not None else None,
        kill_to_release_s=release,
        baseline_bytes=baseline,
        device_after_bytes=device_used(probe),
    )
    probe.close()
    return result


def _wait_dead(root: subprocess.Popen[bytes], pids: list[int], timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        root.poll()
        if not any(alive(p) for p in pids):
            return time.monotonic()
        time.sleep(0.001)
    return None
