"""Is the tree waiting for a CPU? Run-queue wait of its threads and the host's CPU pressure.

`/proc/<pid>/task/<tid>/schedstat` holds three numbers: nanoseconds on a CPU, nanoseconds runnable
but waiting on a runqueue, and timeslices run. A starved thread's wait grows by up to a second per
second; a thread blocked on a futex, a pipe or in a sleep is not runnable and adds nothing. Every
thread is read, not only /proc/<pid>/schedstat, which counts the process's first thread alone.
`/proc/pressure/cpu` (PSI, Linux 4.20+, may be absent or disabled) says whether the whole host is
short of CPU. Every file may be missing (old kernel, no CONFIG_SCHED_INFO, hidepid, another user):
the reading is then `available=False` and the watchdog judges on time alone, as before.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from probes.types import SchedObservation

_NS = 1e-9


def parse_schedstat(text: str) -> tuple[int, int] | None:
    """(on-CPU ns, run-queue wait ns), or None for a malformed line."""
    fields = text.split()
    if len(fields) < 2:
        return None
    try:
        on_cpu, wait = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    if on_cpu < 0 or wait < 0:
        return None
    return on_cpu, wait


def parse_psi(text: str) -> tuple[float | None, float | None]:
    """`some avg10` (percent) and `some total` (seconds) of /proc/pressure/cpu."""
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind != "some":
            continue
        values = dict(item.partition("=")[::2] for item in rest.split())
        try:
            avg10 = float(values["avg10"])
        except (KeyError, ValueError):
            avg10 = None
        try:
            total = int(values["total"]) / 1e6  # microseconds
        except (KeyError, ValueError):
            total = None
        return avg10, total
    return None, None


def _read(path: str) -> str | None:
    # os.open/os.read: one small read per thread of the tree every poll, and a file object costs
    # more than the read (issue 51; a real SGLang rank has dozens of threads).
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # vanished, not ours to read, or the kernel has no such file
        return None
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


class StarvationProbe:
    """Sums run-queue wait and on-CPU time over the threads of the given pids; reads host PSI.

    Blocking (one small read per thread): call it from the observer's worker thread.
    """

    def __init__(self, proc_root: str = "/proc", psi_path: str = "/proc/pressure/cpu") -> None:
        self._proc = proc_root
        self._psi = psi_path

    def observe(self, pids: Iterable[int]) -> SchedObservation:
        wait_ns = cpu_ns = threads = 0
        for pid in pids:
            task_dir = f"{self._proc}/{pid}/task"
            try:
                tids = [t for t in os.listdir(task_dir) if t.isdigit()]
            except OSError:
                tids = []
            # No task directory readable: fall back to the process's own line (its first thread).
            paths = [f"{task_dir}/{t}/schedstat" for t in tids] or [f"{self._proc}/{pid}/schedstat"]
            for path in paths:
                text = _read(path)
                parsed = parse_schedstat(text) if text is not None else None
                if parsed is None:
                    continue
                cpu_ns += parsed[0]
                wait_ns += parsed[1]
                threads += 1
        psi_text = _read(self._psi)
        avg10, total = parse_psi(psi_text) if psi_text is not None else (None, None)
        return SchedObservation(
            available=threads > 0,
            run_wait_s=wait_ns * _NS,
            on_cpu_s=cpu_ns * _NS,
            threads=threads,
            psi_some_avg10=avg10,
            psi_some_total_s=total,
            reason="" if threads > 0 else "no schedstat readable for the tree",
        )
