"""Signals to single processes, sent only to the process that was seen (its start time still matches)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

from probes.proctree import ProcStat, read_stat


def send_signal(pid: int, sig: int) -> bool:
    """Signal a pid; False when it no longer exists or is not ours to signal."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_member(member: ProcStat, sig: int, proc_root: str) -> bool:
    """Signal a process seen earlier, only if that pid is still the same process (start time).

    A pidfd pins the process between the identity check and the signal, so a pid that was
    reused by an unrelated process in between is never signalled.
    """
    try:
        pidfd: int | None = os.pidfd_open(member.pid)
    except ProcessLookupError:
        return False
    except OSError:  # kernel without pidfd: the check-then-kill window is microseconds
        pidfd = None
    try:
        now = read_stat(member.pid, proc_root)
        if now is None or now.starttime != member.starttime:
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(member.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def resume_stopped(pids: Iterable[int], proc_root: str = "/proc") -> list[int]:
    """SIGCONT to those of `pids` left stopped (state T or t), e.g. after py-spy or gdb; returns them."""
    resumed = []
    for pid in pids:
        st = read_stat(pid, proc_root)
        if st is not None and st.state in ("T", "t") and signal_member(st, signal.SIGCONT, proc_root):
            resumed.append(pid)
    return resumed
