"""The daemon, in-process, against the GPU server: one function per scenario, each returning what it saw.

`run_hang` lets the daemon find a deadlock or a spin, capture, stop and verify; `run_serve` brings
the server to ready and reads `/status` (`direct.run_direct` does the hangs without the daemon).
The bench prints these; the GPU tests assert on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.gpuserver.measure import (
    ProbeCost,
    Release,
    ReleaseWatch,
    device_used,
    find_gdb,
    find_py_spy,
    probe_cost,
    wait_released,
)
from probes.gpu import GpuProbe
from supervisor.config.gpu import GpuSettings
from supervisor.config.settings import Settings, settings_from_mapping
from supervisor.diagnostics import parse_cuda_kernels
from supervisor.process import kill_marked
from supervisor.root.gpusource import open_nvml
from supervisor.root.inprocess import InProcessDaemon, StatusSnapshot, start_in_process

ROOT = Path(__file__).resolve().parents[2]
HUNG_STATES = ("hung", "diagnosing", "restarting", "failed")
# Never multicast over NVLink (the device docs say why); harmless on one GPU, kept for any child.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class RunConfig:
    device: str = "cuda"  # "cpu": host memory, for checking the harness without a GPU
    weights_gb: float = 40.0
    poll_s: float = 0.5
    stall_s: float = 5.0
    cpu_only_stall_s: float = 10.0  # a busy spin keeps the host CPU moving: judged after this
    stop_grace_s: float = 2.0
    py_spy_timeout_s: float = 30.0
    gdb_timeout_s: float = 90.0
    release_timeout_s: float = 30.0
    ready_timeout_s: float = 240.0
    env: Mapping[str, str] = field(default_factory=dict)
    gpu: GpuSettings = field(default_factory=GpuSettings)  # [gpu]: the real NVML, or the simulator's GPU


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_env(mode: str, status_file: Path, rc: RunConfig) -> dict[str, str]:
    return {
        "GPU_SERVER_MODE": mode,
        "GPU_SERVER_DEVICE": rc.device,
        "GPU_SERVER_WEIGHTS_GB": str(rc.weights_gb),
        "GPU_SERVER_ONSET_FILE": str(status_file),
        **SAFE_ENV,
        **rc.env,
    }


def settings_for(work: Path, mode: str, rc: RunConfig, *, gdb: str) -> Settings:
    """One rung, no retries: after the incident the daemon stops, verifies and gives up (state `failed`)."""
    return settings_from_mapping(
        {
            "server": {
                "command": [sys.executable, "-m", "bench.gpuserver.server"],
                "port": free_port(),
                "cwd": str(ROOT),
                "env": server_env(mode, work / "status.json", rc),
                "args": {"model-path": "/models/gpu-bench", "tp-size": 1, "enable-metrics": True},
            },
            "watchdog": {
                "poll_interval_s": rc.poll_s,
                "startup_stall_s": rc.stall_s,
                "cpu_only_stall_s": rc.cpu_only_stall_s,
                "startup_timeout_s": 600.0,
                "health_interval_s": 1.0,
                "health_timeout_s": 5.0,
            },
            "restart": {
                "retries_per_rung": 0,
                "backoff_initial_s": 0.2,
                "backoff_max_s": 1.0,
                "stop_grace_s": rc.stop_grace_s,
                "release_timeout_s": rc.release_timeout_s,
                "start_from": "preferred",
            },
            "diagnostics": {
                "py_spy": True,
                "native": True,
                "gdb": gdb,
                "py_spy_timeout_s": rc.py_spy_timeout_s,
                "gdb_timeout_s": rc.gdb_timeout_s,
                "py_spy_path": find_py_spy(),
                "gdb_path": find_gdb(),
            },
            "api": {"port": free_port()},
            "paths": {"state_dir": str(work / "state")},
            "gpu": rc.gpu.model_dump(),
        }
    )


def events(state_dir: Path) -> list[dict[str, Any]]:
    path = state_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _wall(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def read_status(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


@dataclass
class Daemon:
    """The daemon in-process (supervisor.root.inprocess), cleaning up its tree's leftovers on stop."""

    inner: InProcessDaemon

    @property
    def settings(self) -> Settings:
        return self.inner.settings

    def snap(self) -> StatusSnapshot:
        return self.inner.snapshot()

    async def wait_for(self, pred: Callable[[StatusSnapshot], bool], timeout: float, what: str) -> StatusSnapshot:
        return await self.inner.wait_for(pred, timeout, what)

    async def stop(self) -> None:
        try:
            await self.inner.stop(timeout=120)
        finally:
            await asyncio.to_thread(kill_marked, self.inner.marker, grace_s=0.5)


async def start_daemon(settings: Settings) -> Daemon:
    return Daemon(await start_in_process(settings, env=dict(os.environ)))


async def wait_file(path: Path, pred: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = read_status(path)
        if doc is not None and pred(doc):
            return doc
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{path} not written within {timeout:.0f} s")


@dataclass
class HangResult:
    mode: str
    gdb: str
    status: dict[str, Any]  # the server's own status file: pids, bytes allocated, onset time
    cause: str | None = None
    hang_class: str | None = None
    reason: str = ""
    detect_s: float | None = None  # onset -> the daemon's `hung` transition (journal time)
    bundle_id: str | None = None
    bundle_dir: Path | None = None
    bundle_s: float | None = None  # the daemon's capture, as journalled
    summary: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    kernels: tuple[str, ...] = ()  # named by cuda-gdb's `info cuda kernels` in the scheduler's dump
    attach: dict[str, Any] = field(default_factory=dict)  # gdb_facts of the scheduler's dump
    nvml_pids: dict[int, int] = field(default_factory=dict)  # pid -> bytes in the bundle's nvml.json
    stopped: dict[str, Any] = field(default_factory=dict)  # the journal's server_stopped event
    release: Release = field(default_factory=Release)
    device_after_bytes: int | None = None
    baseline_bytes: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    def tool(self, pid: int, name: str) -> dict[str, Any] | None:
        return next((t for t in self.tools if t["pid"] == pid and t["tool"] == name), None)

    def file(self, name: str) -> str:
        assert self.bundle_dir is not None
        path = self.bundle_dir / name
        return path.read_text(errors="replace") if path.exists() else ""


_EXITED = re.compile(r"^\[Thread 0x[0-9a-f]+ \(LWP \d+\) exited\]$", re.M)
_FOCUS = re.compile(r"^0x[0-9a-f]+ in (\S+<<<[^>]*>>>)", re.M)


def gdb_facts(text: str) -> dict[str, Any]:
    """What a cuda-gdb attach did besides printing stacks: threads of the target that exited meanwhile,
    a helper the target forked, and the kernel it switched focus to."""
    focus = _FOCUS.search(text)
    return {
        "threads_exited": len(_EXITED.findall(text)),
        "forked_helper": "Detaching after fork" in text,
        "kernel_focus": focus.group(1) if focus else None,
    }


def _nvml_pids(doc: dict[str, Any]) -> dict[int, int]:
    out: dict[int, int] = {}
    for proc in doc.get("processes", []):
        out[int(proc["pid"])] = out.get(int(proc["pid"]), 0) + int(proc.get("used_bytes") or 0)
    return out


async def run_hang(work: Path, mode: str, rc: RunConfig, *, gdb: str = "on_hang") -> HangResult:
    """Launch under the daemon, let it detect, capture, stop and verify; read what it recorded."""
    work.mkdir(parents=True, exist_ok=True)
    settings = settings_for(work, mode, rc, gdb=gdb)
    probe = GpuProbe(open_nvml(rc.gpu))
    baseline = device_used(probe)
    daemon = await start_daemon(settings)
    watch: ReleaseWatch | None = None
    try:
        status = await wait_file(work / "status.json", lambda d: d.get("onset_wall") is not None, rc.ready_timeout_s)
        watch = ReleaseWatch(probe, (status["main_pid"], status["scheduler_pid"]), baseline).start()
        budget = rc.cpu_only_stall_s + 4 * rc.gdb_timeout_s + 60
        snap = await daemon.wait_for(lambda s: s.state == "failed", budget, "stop after the incident")
    finally:
        await daemon.stop()
    result = HangResult(mode=mode, gdb=gdb, status=status, baseline_bytes=baseline)
    result.release = await asyncio.to_thread(watch.join, 60.0) if watch is not None else Release()
    result.device_after_bytes = device_used(probe)
    probe.close()
    inc = snap.last_incident
    ev = events(settings.state_dir)
    result.events = ev
    if inc is not None:
        result.cause, result.hang_class, result.reason, result.bundle_id = (
            inc.cause,
            inc.hang_class,
            inc.detail,
            inc.bundle,
        )
    hung = next((e for e in ev if e["event"] == "state_changed" and e.get("new") == "hung"), None)
    if hung is not None:
        result.detect_s = _wall(hung["ts"]) - float(status["onset_wall"])
    written = next((e for e in ev if e["event"] == "bundle_written"), None)
    if written is not None:
        result.bundle_s = float(written["duration_s"])
    result.stopped = next((e for e in ev if e["event"] == "server_stopped"), {})
    if result.bundle_id:
        result.bundle_dir = settings.state_dir / "diagnostics" / result.bundle_id
        result.summary = json.loads((result.bundle_dir / "summary.json").read_text())
        result.tools = list(result.summary.get("tools", []))
        dump = result.file(f"gdb-{status['scheduler_pid']}.txt")
        result.kernels = parse_cuda_kernels(dump)
        result.attach = gdb_facts(dump)
        result.nvml_pids = _nvml_pids(json.loads(result.file("nvml.json") or "{}"))
    return result


@dataclass
class ServeResult:
    status: dict[str, Any]
    ready_s: float  # launch -> ready, as the daemon saw it
    api_status: dict[str, Any]  # GET /status while ready
    nvml_pids: dict[int, int]  # the probe's attribution: pid -> bytes
    util_percent: float
    cost: ProbeCost
    stopped: dict[str, Any]
    baseline_bytes: int | None
    device_ready_bytes: int | None
    device_after_bytes: int | None
    release_s: float | None  # after the daemon's verified stop, until the device is back at baseline


async def run_serve(work: Path, rc: RunConfig, *, calls: int = 100) -> ServeResult:
    work.mkdir(parents=True, exist_ok=True)
    settings = settings_for(work, "serve", rc, gdb="never")
    probe = GpuProbe(open_nvml(rc.gpu))
    baseline = device_used(probe)
    daemon = await start_daemon(settings)
    try:
        snap = await daemon.wait_for(lambda s: s.state in ("ready", *HUNG_STATES), rc.ready_timeout_s, "ready")
        if snap.state != "ready":
            raise AssertionError(f"server did not serve: {snap.state} ({snap.reason})")
        with contextlib.suppress(TimeoutError):  # no attribution is a finding, recorded below, not a crash
            await daemon.wait_for(lambda s: s.gpu.tree_mem_bytes > 0 or s.gpu.status != "ok", 10, "GPU attribution")
        status = read_status(work / "status.json") or {}
        async with httpx.AsyncClient(timeout=10) as client:
            api_status = (await client.get(f"http://127.0.0.1:{settings.api.port}/status")).json()
        pids = [p.pid for p in daemon.snap().processes]
        obs = await asyncio.to_thread(probe.observe, pids)
        nvml_pids: dict[int, int] = {}
        for proc in obs.processes:
            nvml_pids[proc.pid] = nvml_pids.get(proc.pid, 0) + proc.used_bytes
        cost = await asyncio.to_thread(probe_cost, probe, pids, calls)
        device_ready = device_used(probe)
        ready_s = snap.time_to_ready_s or 0.0
    finally:
        await daemon.stop()
    ev = events(settings.state_dir)
    stopped = next((e for e in ev if e["event"] == "server_stopped"), {})
    all_pids = [int(p) for p in stopped.get("pids_found", [])]
    release = await asyncio.to_thread(wait_released, probe, all_pids, baseline, 30.0)
    result = ServeResult(
        status=status,
        ready_s=ready_s,
        api_status=api_status,
        nvml_pids=nvml_pids,
        util_percent=obs.max_util_percent if obs.status == "ok" else 0.0,
        cost=cost,
        stopped=stopped,
        baseline_bytes=baseline,
        device_ready_bytes=device_ready,
        device_after_bytes=device_used(probe),
        release_s=release,
    )
    probe.close()
    return result
