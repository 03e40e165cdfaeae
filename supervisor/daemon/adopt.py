"""Adoption: a restarted daemon takes over the server tree its predecessor left running.

The daemon must never be the cause of a model reload: a daemon that crashed, was SIGKILLed, was
aborted by systemd's watchdog or handed over for an upgrade leaves the server serving, and its
successor adopts it. What is adopted must provably be that server: the pid alone proves nothing
(pids are reused), so the saved pid, the process's start time (clock ticks after boot, from
/proc/<pid>/stat) and the marker in its environment must all match. A tree that fails any of the
three is stopped by marker as before, and a process that merely reuses the pid is left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

from probes.proctree import carries_marker, read_stat
from supervisor.logs.reader import LogPosition


@dataclass(frozen=True)
class ServerRecord:
    """What state.json keeps about the running server, for a successor to adopt it."""

    pid: int
    starttime: int  # clock ticks after boot: the pid's identity together with `pid`
    rung: str  # the rung it was launched on
    launched_wall: float  # unix time of the launch
    log: LogPosition | None  # just past the last log line the daemon read
    time_to_ready_s: float | None = None  # launch to ready, once the launching daemon saw it

    def to_json(self) -> dict[str, object]:
        log = None if self.log is None else {"inode": self.log.inode, "offset": self.log.offset}
        return {
            "pid": self.pid,
            "starttime": self.starttime,
            "rung": self.rung,
            "launched_wall": self.launched_wall,
            "log": log,
            "time_to_ready_s": self.time_to_ready_s,
        }

    @classmethod
    def from_json(cls, doc: object) -> ServerRecord | None:
        """The record, or None when absent or not exactly what `to_json` writes (never adopt on a guess)."""
        if not isinstance(doc, dict):
            return None
        pid, starttime, rung, wall = doc.get("pid"), doc.get("starttime"), doc.get("rung"), doc.get("launched_wall")
        if not (_count(pid) and pid > 1 and _count(starttime) and isinstance(rung, str) and rung):
            return None
        if not isinstance(wall, (int, float)) or isinstance(wall, bool) or not math.isfinite(wall):
            return None
        log = doc.get("log")
        position = None
        if isinstance(log, dict) and _count(log.get("inode")) and _count(log.get("offset")):
            position = LogPosition(inode=log["inode"], offset=log["offset"])
        ready = doc.get("time_to_ready_s")
        ttr = float(ready) if isinstance(ready, (int, float)) and not isinstance(ready, bool) else None
        if ttr is not None and not (math.isfinite(ttr) and 0 <= ttr < 1e7):
            ttr = None
        return cls(
            pid=pid, starttime=starttime, rung=rung, launched_wall=float(wall), log=position, time_to_ready_s=ttr
        )


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def starttime_of(pid: int, proc_root: str = "/proc") -> int | None:
    st = read_stat(pid, proc_root)
    return None if st is None or st.zombie else st.starttime


def refusal(record: ServerRecord, marker: str, proc_root: str = "/proc") -> str | None:
    """None when the recorded server is alive and provably ours; otherwise why it is not adopted."""
    st = read_stat(record.pid, proc_root)
    if st is None:
        return f"pid {record.pid} is gone"
    if st.zombie:
        return f"pid {record.pid} has exited"
    if st.starttime != record.starttime:
        return f"pid {record.pid} is another process now (started at tick {st.starttime}, ours at {record.starttime})"
    if not marker or not carries_marker(record.pid, marker, proc_root):
        return f"pid {record.pid} does not carry this state directory's marker"
    return None
