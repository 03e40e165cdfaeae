"""Stopping single processes that are not the server tree: leftovers the clean slate found (a
`sglang::` orphan of an earlier server, a process with this daemon's marker on a GPU)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable

from probes.proctree import ProcStat, read_stat
from supervisor.process.signals import signal_member
from supervisor.process.stop import StopReport

POLL_S = 0.05


def stop_pids(
    pids: Iterable[int],
    grace_s: float,
    *,
    kill_wait_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    proc_root: str = "/proc",
) -> StopReport:
    """SIGTERM, `grace_s`, SIGKILL, then verify each is gone. Each signal goes only to the process
    seen (its start time), so a reused pid is never touched. Blocking: run it in a thread."""
    start = monotonic()
    seen = {st.pid: st for pid in pids if (st := read_stat(pid, proc_root)) is not None and st.state != "Z"}

    def live() -> dict[int, ProcStat]:
        out = {}
        for pid, st in seen.items():
            now = read_stat(pid, proc_root)
            if now is not None and now.starttime == st.starttime and now.state not in ("Z", "X"):
                out[pid] = st
        return out

    termed = {pid for pid, st in seen.items() if signal_member(st, signal.SIGTERM, proc_root)}
    for st in seen.values():  # a stopped process cannot act on SIGTERM until continued
        signal_member(st, signal.SIGCONT, proc_root)
    left = live()
    while left and monotonic() < start + grace_s:
        sleep(POLL_S)
        left = live()
    grace_expired = bool(left)
    killed = {pid for pid, st in left.items() if signal_member(st, signal.SIGKILL, proc_root)}
    until = monotonic() + kill_wait_s
    while left and monotonic() < until:
        sleep(POLL_S)
        left = live()
    return StopReport(
        pids_found=tuple(sorted(seen)),
        termed=tuple(sorted(termed)),
        killed=tuple(sorted(killed)),
        survivors=tuple(sorted(left)),
        port_free=True,
        port_holders=(),
        exit_code=None,
        duration_s=monotonic() - start,
        grace_expired=grace_expired,
    )
