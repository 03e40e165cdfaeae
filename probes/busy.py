"""Where the busy threads are: a Python-only, non-blocking py-spy look at the processes burning CPU.

While a server starts, CPU can be the only channel that moves for a long time: a first compilation
(inductor, triton, nvcc, deep_gemm's JIT) is progress, a thread spinning in `Event.synchronize` on a
kernel that never ends is not. Only py-spy can tell them apart from the outside. The look is cheap:
no native frames (no unwinding), `--nonblocking` (the process is never paused), only the processes
above a CPU rate, in parallel, each bounded by a timeout. The supervisor asks for it only while CPU
is the only channel moving (the watchdog's `wants_busy_sample`).

Blocking: called from the observer's worker thread. Never raises; a missing or failing py-spy is
recorded in the sample's `error`.
"""

from __future__ import annotations

import linecache
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from probes.types import BusySample, BusyThread, PyFrame, TreeObservation

MAX_PROCESSES = 4  # the busiest; a TP-8 tree spins one core per rank, and one rank says enough
MAX_FRAMES = 40
MAX_THREADS = 64  # active threads kept per process
MAX_SOURCE_BYTES = 2 * 1024 * 1024
MAX_CACHED_FILES = 512
BUSY_CORES = 0.1  # a process below this rate is not what burns the CPU (a spinner on a loaded host gets less)

_THREAD = re.compile(r"^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?::\s*\"(.*)\")?\s*$")
_FRAME = re.compile(r"^\s+(.+?) \(([^()]*?)(?::(\d+))?\)\s*$")


def py_spy_look_argv(exe: str, pid: int) -> tuple[str, ...]:
    # Never --locals (secrets) and never --native (it must pause the process to unwind).
    return (exe, "dump", "--pid", str(pid), "--nonblocking", "--full-filenames")


def _source(file: str, line: int | None) -> str:
    """The stripped source line (the rule reads `.item()` calls there); "" when unreadable or huge."""
    if line is None or not file.endswith(".py"):
        return ""
    try:
        if os.path.getsize(file) > MAX_SOURCE_BYTES:
            return ""
        if len(linecache.cache) > MAX_CACHED_FILES:  # bounded memory across a long start-up
            linecache.clearcache()
        return linecache.getline(file, line).strip()[:200]
    except Exception:  # an unreadable or vanished file: the frame still counts by its name
        return ""


def parse_active_threads(pid: int, text: str) -> tuple[BusyThread, ...]:
    """The threads py-spy marked active, innermost frame first, with their source lines."""
    out: list[BusyThread] = []
    head: tuple[int | None, str, bool] | None = None
    frames: list[PyFrame] = []

    def close() -> None:
        if head is not None and head[2] and len(out) < MAX_THREADS:
            out.append(BusyThread(pid=pid, tid=head[0], name=head[1], frames=tuple(frames[:MAX_FRAMES])))

    for raw in text.splitlines():
        m = _THREAD.match(raw)
        if m:
            close()
            tid = None if m.group(1).startswith("0x") else int(m.group(1))
            head, frames = (tid, m.group(3) or "", "active" in m.group(2)), []
            continue
        f = _FRAME.match(raw) if head is not None else None
        if f and len(frames) < MAX_FRAMES:
            line = int(f.group(3)) if f.group(3) else None
            frames.append(PyFrame(f.group(1), f.group(2), line, _source(f.group(2), line)))
    close()
    return tuple(out)


class BusyProbe:
    """Keeps each process's CPU time between polls, and samples the busy ones when asked."""

    def __init__(
        self,
        py_spy: str | None,
        *,
        timeout_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        env: dict[str, str] | None = None,
    ) -> None:
        self._exe = py_spy if py_spy is None or "/" in py_spy else shutil.which(py_spy)
        self._timeout_s = timeout_s
        self._monotonic = monotonic
        self._env = env
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (cpu_time_s, when read)
        self.disabled = ""  # why looks are off by configuration ("" when on)

    def note(self, tree: TreeObservation) -> dict[int, float]:
        """Record this poll's CPU times; returns each process's rate (cores) since the last poll."""
        now = self._monotonic()
        rates: dict[int, float] = {}
        seen: dict[int, tuple[float, float]] = {}
        for p in tree.processes:
            seen[p.pid] = (p.cpu_time_s, now)
            before = self._cpu.get(p.pid)
            if before is not None and now > before[1]:
                rates[p.pid] = max(0.0, p.cpu_time_s - before[0]) / (now - before[1])
        self._cpu = seen
        return rates

    def sample(self, rates: dict[int, float]) -> BusySample:
        tic = self._monotonic()
        busy = sorted((pid for pid, r in rates.items() if r >= BUSY_CORES), key=lambda p: -rates[p])
        pids = tuple(busy[:MAX_PROCESSES])
        if self.disabled or self._exe is None:
            why = self.disabled or "py-spy not found (install py-spy or set [diagnostics] py_spy_path)"
            return BusySample(at=tic, pids=pids, threads=(), error=why)
        if not pids:
            return BusySample(at=tic, pids=(), threads=())
        with ThreadPoolExecutor(max_workers=len(pids)) as pool:
            results = list(pool.map(self._dump, pids))
        threads = tuple(t for found, _ in results for t in found)
        errors = "; ".join(err for _, err in results if err)
        return BusySample(
            at=tic, pids=pids, threads=threads, error=errors[:400], duration_s=round(self._monotonic() - tic, 4)
        )

    def _dump(self, pid: int) -> tuple[tuple[BusyThread, ...], str]:
        assert self._exe is not None
        try:
            res = subprocess.run(
                py_spy_look_argv(self._exe, pid),
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self._timeout_s,
                env=self._env,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return (), f"pid {pid}: py-spy took over {self._timeout_s:g} s"
        except OSError as err:
            return (), f"pid {pid}: py-spy could not run ({err.strerror or err})"
        if res.returncode != 0 or "Thread " not in res.stdout:
            why = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
            return (), f"pid {pid}: py-spy failed ({why[:160]})"
        return parse_active_threads(pid, res.stdout), ""
