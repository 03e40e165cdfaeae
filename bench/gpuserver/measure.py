"""Measurements that run beside the daemon: NVML memory on the device, process death and GPU release,
the probe's cost per poll, and finding the dump tools where an install put them."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from probes.gpu import GpuProbe

RELEASE_SLACK_BYTES = 512 * 1024**2  # device memory within this of the baseline counts as given back
CUDA_GDB_PLACES = ("/usr/local/cuda/bin/cuda-gdb", "/opt/nvidia/cuda/bin/cuda-gdb")


def device_used(probe: GpuProbe) -> int | None:
    """Bytes in use on all GPUs together (NVML's per-device `used`), None without NVML."""
    obs = probe.snapshot_all()
    if obs.status != "ok":
        return None
    return sum(d.mem_used_bytes for d in obs.devices)


def alive(pid: int) -> bool:
    """Running, sleeping or stopped; a zombie has already let go of its memory and files."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X", "x")


def released(probe: GpuProbe, pids: Collection[int], baseline: int | None) -> bool:
    if probe.held_by(pids):
        return False
    used = device_used(probe)
    return used is None or baseline is None or used <= baseline + RELEASE_SLACK_BYTES


@dataclass
class Release:
    """When the watched processes were all gone, and when NVML showed their memory given back."""

    dead_at: float | None = None
    released_at: float | None = None
    polls: int = 0

    @property
    def after_death_s(self) -> float | None:
        if self.dead_at is None or self.released_at is None:
            return None
        return max(0.0, self.released_at - self.dead_at)


class ReleaseWatch:
    """A thread that waits for `pids` to die, then polls NVML until their memory is free again.

    Polls every few milliseconds, so its figures do not depend on the daemon's own poll interval.
    """

    def __init__(self, probe: GpuProbe, pids: Sequence[int], baseline: int | None, timeout_s: float = 600.0) -> None:
        self.result = Release()
        self._probe = probe
        self._pids = tuple(pids)
        self._baseline = baseline
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="release-watch", daemon=True)

    def start(self) -> ReleaseWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        until = time.monotonic() + self._timeout_s
        while any(alive(p) for p in self._pids):
            if self._stop.wait(0.005) or time.monotonic() > until:
                return
        self.result.dead_at = time.monotonic()
        while not released(self._probe, self._pids, self._baseline):
            self.result.polls += 1
            if self._stop.wait(0.002) or time.monotonic() > until:
                return
        self.result.released_at = time.monotonic()

    def join(self, timeout: float) -> Release:
        self._thread.join(timeout)
        self._stop.set()
        return self.result


def wait_released(probe: GpuProbe, pids: Collection[int], baseline: int | None, timeout_s: float) -> float | None:
    """Seconds until NVML shows `pids` holding nothing and the device back at its baseline; None on timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if released(probe, pids, baseline):
            return time.monotonic() - start
        time.sleep(0.002)
    return None


@dataclass(frozen=True)
class ProbeCost:
    calls: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    max_ms: float


def probe_cost(probe: GpuProbe, pids: Collection[int], calls: int = 100) -> ProbeCost:
    """Time `GpuProbe.observe(pids)`, the call the daemon makes once per poll."""
    probe.observe(pids)  # NVML is initialised once per daemon; not part of a poll's cost
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        probe.observe(pids)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return ProbeCost(
        calls=calls,
        mean_ms=statistics.fmean(times),
        p50_ms=times[len(times) // 2],
        p95_ms=times[min(len(times) - 1, int(len(times) * 0.95))],
        max_ms=times[-1],
    )


def find_py_spy() -> str | None:
    """PATH, then a `bin/py-spy` beside an entry of sys.path (where `pip install --target DIR` puts it)."""
    found = shutil.which("py-spy")
    if found:
        return found
    for entry in sys.path:
        candidate = Path(entry or ".") / "bin" / "py-spy"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_gdb() -> str | None:
    """gdb or cuda-gdb on PATH, else cuda-gdb where CUDA installs put it."""
    for name in ("gdb", "cuda-gdb"):
        found = shutil.which(name)
        if found:
            return found
    return next((p for p in CUDA_GDB_PLACES if os.access(p, os.X_OK)), None)
