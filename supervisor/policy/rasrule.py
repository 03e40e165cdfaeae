"""NCCL's RAS as a hang detector (issue 35): a pure rule over successive RAS reports.

Ray Train's callback polls `ncclras -f json` and calls a hang when a communicator's ranks all run,
their operation counts differ, and the counts stay frozen for a confirm window. The same here, per
communicator with a rank in the server's tree:

- every rank present (none missing), the per-operation counts differ between ranks, and not one
  count moved for `ras_confirm_s`: a collective hang; the verdict names the rank(s) whose count lags
  (the one(s) the others wait for), with pid and host;
- a rank NCCL considers dead: the group's `rank_died` at once; one it finds unresponsive: the same
  once it stayed so for `ras_confirm_s` (a peer on another node whose daemon is gone counts too).

RAS counts no graph-captured collectives (NCCL's profiler plugin says so): with CUDA graphs a
decode step moves no count at all, and equal frozen counts say nothing. Token progress stays the
primary signal; this rule only adds what NCCL itself knows.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from probes.ras import RasComm, RasReport

Key = tuple[str, int]  # (communicator hash, rank)


@dataclass(frozen=True)
class RasState:
    counts: tuple[tuple[Key, tuple[tuple[str, int], ...]], ...] = ()  # what the last report said
    frozen_since: float | None = None  # since when a differing set of counts has not moved
    unresponsive_since: float | None = None  # since when some rank has been unresponsive
    last_status: str = ""  # the last report's status (ok, absent, ...)


@dataclass(frozen=True)
class RasVerdict:
    cause: str  # "rank_died" | "collective_hang"
    reason: str
    lagging: tuple[int, ...]  # ranks whose counts lag, or the missing ranks


def _ours(report: RasReport, tree_pids: Collection[int]) -> tuple[RasComm, ...]:
    pids = set(tree_pids)
    return tuple(c for c in report.communicators if any(r.pid in pids for r in c.ranks))


def _lag(c: RasComm) -> tuple[tuple[int, ...], str, int, int]:
    """(lagging ranks, operation, their count, the others' count) or ((), ...) when counts agree."""
    most: dict[str, int] = {}
    for r in c.ranks:
        for op, n in r.counts:
            most[op] = max(most.get(op, 0), n)
    for op, top in sorted(most.items()):
        behind = tuple(sorted(r.rank for r in c.ranks if dict(r.counts).get(op, 0) < top))
        if behind:
            low = min(dict(r.counts).get(op, 0) for r in c.ranks)
            return behind, op, low, top
    return (), "", 0, 0


def _where(c: RasComm, ranks: tuple[int, ...]) -> str:
    by = {r.rank: r for r in c.ranks}
    return ", ".join(f"rank {r} (pid {by[r].pid} on {by[r].host or '?'})" for r in ranks if r in by)


def fold_ras(
    state: RasState, report: RasReport | None, tree_pids: Collection[int], now: float, confirm_s: float
) -> tuple[RasState, RasVerdict | None]:
    """This poll's report folded in (None: no report due this poll: the state stands)."""
    if report is None:
        return state, None
    if report.status != "ok":
        return RasState(last_status=report.status), None
    comms = _ours(report, tree_pids)
    dead = [(c, m) for c in comms for m in c.missing if m.dead]
    unresponsive = [(c, m) for c in comms for m in c.missing if m.unresponsive and not m.dead]
    counts = tuple(sorted(((c.hash, r.rank), tuple(sorted(r.counts))) for c in comms for r in c.ranks))
    lags = [(c, *_lag(c)) for c in comms if not c.missing]
    lagging = [x for x in lags if x[1]]
    # Since when these very counts have been seen (the first report of them starts the window).
    same = counts == state.counts and state.frozen_since is not None
    frozen_since = (state.frozen_since if same else now) if lagging else None
    since = state.unresponsive_since
    unresponsive_since = (since if since is not None else now) if unresponsive else None
    new = RasState(counts, frozen_since, unresponsive_since, "ok")
    if dead or (unresponsive_since is not None and now - unresponsive_since >= confirm_s):
        c, m = (dead or unresponsive)[0]
        how = "dead" if m.dead else "unresponsive"
        why = (
            f"NCCL RAS: communicator {c.hash} (size {c.size}) lost rank {m.rank} (pid {m.pid} on {m.host or '?'}): "
            f"NCCL considers it {how}"
        )
        return new, RasVerdict("rank_died", why, tuple(sorted({x.rank for _, x in dead or unresponsive})))
    if lagging and new.frozen_since is not None and now - new.frozen_since >= confirm_s:
        c, ranks, op, low, top = lagging[0]
        why = (
            f"NCCL RAS: communicator {c.hash} (size {c.size}): {_where(c, ranks)} ran {op} {low} times, "
            f"the others {top}, and no count moved for {now - new.frozen_since:.0f} s"
        )
        return new, RasVerdict("collective_hang", why, ranks)
    return new, None
