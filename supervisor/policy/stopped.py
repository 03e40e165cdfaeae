"""Process state as evidence (issue 51): a stopped process of the tree while health fails.

Pure, like the watchdog that calls it. The tree probe reads each process's state letter every poll
(`ProcInfo.status`, `stopped` for state T: SIGSTOP, a terminal's Ctrl-Z, a debugger's group stop);
the watchdog keeps, per pid, the poll that first saw it stopped. A process seen stopped at this poll
and the one before while the last health check failed is the hang, judged now rather than after
`health_failures` timeouts. A tracer's stop (state t: py-spy, gdb, the daemon's own capture) is not
state T and never counts; nor does a stop while health answers (a person's debugger, briefly), a
stop seen at one poll only, or one that ended before health failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from probes.types import Observation


def stopped_members(before: Mapping[int, float], obs: Observation, now: float) -> dict[int, float]:
    """The tree's processes in state T at this poll, each with the poll that first saw it so; a
    process that ran at a poll in between starts again."""
    return {p.pid: before.get(p.pid, now) for p in obs.tree.processes if p.status == "stopped"}


@dataclass(frozen=True)
class HeldStopped:
    reason: str
    figures: tuple[tuple[str, float], ...]


def _named(pid: int, obs: Observation) -> str:
    p = next((x for x in obs.tree.processes if x.pid == pid), None)
    if p is None:
        return f"pid {pid}"
    if p.role == "main":
        return f"the server's main process (HTTP front end) pid {pid}"
    rank = f" TP{p.rank}" if p.rank is not None else ""
    return f"{p.role}{rank} pid {pid}"


def held_stopped(since: Mapping[int, float], health_failures: int, obs: Observation, now: float) -> HeldStopped | None:
    """The finding, or None: the longest-stopped process named first, every one held named."""
    if health_failures < 1:
        return None
    held = sorted((t, pid) for pid, t in since.items() if t < now)
    if not held:
        return None
    first, pid = held[0]
    names = ", ".join(_named(p, obs) for _, p in held)
    err = obs.health.error if obs.health is not None and not obs.health.ok else "failed"
    return HeldStopped(
        reason=(
            f"{names} stopped (state T: SIGSTOP or a debugger) for {now - first:.0f} s while the health check"
            f" fails ({err}): a stopped process runs nothing, so the server cannot answer"
        ),
        figures=(
            ("health_failures", float(health_failures)),
            ("stopped_pid", float(pid)),
            ("stopped_s", round(now - first, 3)),
        ),
    )
