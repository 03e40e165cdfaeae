"""The group's verdict: the leader's own verdict combined with every member's report. Pure.

A multi-node SGLang server is one server: a worker's dead rank or stalled start-up is the group's
incident, and a stall that node 0 sees (its collectives wait on a peer) is explained by the node
whose rank stopped or died. A member *daemon* that cannot be reached, or is restarting, says
nothing about the servers: that is `degraded`, named, never an incident. Only the servers' own
behaviour (ranks, progress, health at node 0) decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from probes.types import Phase
from supervisor.policy.lifecycle import SERVING_NAMES
from supervisor.status.causes import Cause

GroupStatus = Literal["ok", "degraded", "incident"]

# States in which a node's server is up (the report's `state` is the daemon's lifecycle state).
_UP = frozenset({"starting", "ready", "degraded"})
# Start-up phases in order (probes.types.Phase is written in order): a node behind the others at a
# start-up stall is the one that never joined.
PHASES: tuple[Phase, ...] = get_args(Phase)
_STALLS = frozenset({"startup_stall", "startup_timeout", "serving_stall", "unhealthy"})


@dataclass(frozen=True)
class RankView:
    """One process of a node's server tree, as its daemon's process probe saw it."""

    pid: int
    role: str  # "main", "scheduler", "detokenizer", ...
    rank: int | None  # tensor-parallel rank for schedulers
    status: str  # psutil status: "running", "sleeping", "stopped" (SIGSTOP, state T), "zombie", ...


@dataclass(frozen=True)
class NodeReport:
    """What one node's daemon says about its server (GET /group/report)."""

    node: int
    state: str  # the daemon's lifecycle state
    phase: str | None
    pid: int | None
    rung: str
    cause: Cause | None  # an incident the node's own watchdog judged and holds for the leader
    reason: str
    ranks: tuple[RankView, ...]
    lost_ranks: tuple[int, ...]  # scheduler pids that were seen and are gone
    last_progress_s: float | None
    at: float  # wall clock of the report
    incident: str | None = None  # the group incident the node last captured for
    instance: str = ""  # the reporting daemon's random id for its life (a second daemon claiming its rank differs)
    identity: str = ""  # the reporting daemon's state directory, stable across its restarts (issue 54)
    # its group-relevant config (supervisor/group/fingerprint.py)
    fingerprint: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MemberView:
    """The leader's latest knowledge of one member."""

    node: int
    address: str
    reachable: bool
    report: NodeReport | None  # the last report that arrived (None: never reached)
    unreachable_s: float = 0.0  # how long requests to it have failed (0 while reachable)
    error: str = ""


@dataclass(frozen=True)
class OwnVerdict:
    """The leader's own watchdog verdict this poll, and its lifecycle state."""

    state: str
    status: str  # the watchdog's status: "starting", "ready", "degraded", "incident"
    cause: Cause | None
    reason: str
    phase: str | None


@dataclass(frozen=True)
class GroupVerdict:
    status: GroupStatus
    cause: Cause | None = None
    reason: str = ""
    node: int | None = None  # the node named as the origin
    rank: int | None = None  # and its rank, where known
    degraded: tuple[int, ...] = ()  # nodes named while the group still serves
    # Every node that showed the fault itself, where more than one did (issue 54: a start-up hang on
    # every node is the rung's, booked on the ladder as one node's would be, never "a node away").
    alike: tuple[int, ...] = ()
    # the member whose own start-up stall at the rendezvous this verdict explains by `node`, absent
    stalled_for: int | None = None

    @property
    def is_incident(self) -> bool:
        return self.status == "incident"


def _stopped(r: NodeReport) -> RankView | None:
    for p in r.ranks:
        if p.status in ("stopped", "tracing-stop") and p.role in ("scheduler", "main", "detokenizer"):
            return p
    return None


def _rank_label(p: RankView) -> str:
    who = f"rank {p.rank}" if p.rank is not None else p.role
    return f"{who} pid {p.pid}"


def _phase_index(phase: str | None) -> int:
    return PHASES.index(phase) if phase in PHASES else 0


def _explain(own: OwnVerdict, members: tuple[MemberView, ...]) -> tuple[str, int | None, int | None]:
    """Which node explains a stall the leader saw: a stopped rank, a dead rank, a node whose server
    is not up, a node behind at start-up, or one that cannot be asked. Empty: node 0 itself."""
    seen = [m for m in members if m.reachable and m.report is not None]
    for m in seen:
        assert m.report is not None
        p = _stopped(m.report)
        if p is not None:
            return f"node {m.node} {_rank_label(p)} stopped (state T)", m.node, p.rank
    for m in seen:
        assert m.report is not None
        if m.report.lost_ranks:
            return f"node {m.node} lost rank process(es) {list(m.report.lost_ranks)}", m.node, None
    for m in seen:
        assert m.report is not None
        if m.report.state not in _UP:
            return f"node {m.node} runs no server (state {m.report.state})", m.node, None
    if own.cause in ("startup_stall", "startup_timeout"):
        behind = [m for m in seen if m.report is not None and m.report.state == "starting"]
        mine = _phase_index(own.phase)
        level: list[MemberView] = []
        for m in sorted(behind, key=lambda m: _phase_index(m.report.phase if m.report else None)):
            assert m.report is not None
            if _phase_index(m.report.phase) < mine:
                return f"node {m.node} never joined (still {m.report.phase or 'spawning'})", m.node, None
            if not _joined(m.report.phase, mine):
                level.append(m)
        # A member level with node 0 at the rendezvous waits there too: a node that cannot be asked
        # explains both (issue 54: in a group of three the journal names the absent node).
        away = _away(members, ())
        if away is not None:
            return away
        for m in level:
            assert m.report is not None
            return f"node {m.node} never joined (still {m.report.phase or 'spawning'})", m.node, None
    for m in members:
        if not m.reachable:
            return f"node {m.node} cannot be asked ({m.error or 'unreachable'})", m.node, None
    return "", None, None


_JOINED_AFTER = PHASES.index("initializing")  # past distributed init every rank has joined the group


def _joined(theirs: str | None, mine: int) -> bool:
    """Whether a member still starting has joined node 0's group: it is not behind node 0's phase,
    and past the rendezvous (distributed init) when level with it. A member that joined and then
    hung in node 0's phase shows the fault itself; it is never "away" (issue 54)."""
    i = _phase_index(theirs)
    return i > mine or (i == mine and i > _JOINED_AFTER)


def _away(members: tuple[MemberView, ...], but: tuple[int, ...]) -> tuple[str, int, None] | None:
    for m in members:
        if not m.reachable and m.node not in but:
            return f"node {m.node} cannot be asked ({m.error or 'unreachable'})", m.node, None
    return None


def _absent_for(r: NodeReport, members: tuple[MemberView, ...]) -> tuple[str, int, None] | None:
    """A member's own start-up stall at the rendezvous (not past distributed init) while another
    node cannot be asked or has not reached it: that node explains it, as it would node 0's (issue
    54: at any group size the absent node is waited for, and named)."""
    if r.cause not in ("startup_stall", "startup_timeout") or _phase_index(r.phase) > _JOINED_AFTER:
        return None
    away = _away(members, (r.node,))
    if away is not None:
        return away
    for m in members:  # a node late: it answers, and its server has not reached the rendezvous
        o = m.report
        if m.node == r.node or o is None or o.cause is not None:
            continue
        if o.state not in _UP or (o.state == "starting" and _phase_index(o.phase) <= _JOINED_AFTER):
            return f"node {m.node} never joined (still {o.phase or o.state})", m.node, None
    return None


def _alike(own: OwnVerdict, members: tuple[MemberView, ...], first: int, cause: str) -> tuple[int, ...]:
    """The nodes that showed the fault themselves, where more than one did: each node holding an
    incident of the same cause, and at node 0's start-up stall a member that joined and stalled in
    the same phase (its own watchdog has not said so yet). A stall of node 0 that follows a
    member's dead rank is that member's fault, not node 0's (issue 54: name the right node)."""
    nodes = {first}
    if own.status == "incident" and own.cause == cause:
        nodes.add(0)
    for m in members:
        r = m.report
        if not m.reachable or r is None:
            continue
        if r.cause is not None:
            if r.cause == cause:
                nodes.add(m.node)
        elif own.cause in ("startup_stall", "startup_timeout") and 0 in nodes and r.state == "starting":
            mine = _phase_index(own.phase)
            nodes |= {m.node} if _phase_index(r.phase) == mine and _joined(r.phase, mine) else set()
    return tuple(sorted(nodes)) if len(nodes) > 1 else ()


def _alike_text(alike: tuple[int, ...], phase: str | None) -> str:
    where = f" in phase {phase}" if phase else ""
    return f"; nodes {', '.join(map(str, alike))} showed the fault alike{where}: the rung's, not a node away"


def combine(own: OwnVerdict, members: tuple[MemberView, ...], unreachable_s: float) -> GroupVerdict:
    """The group's verdict this poll (see the module docstring)."""
    for m in members:  # a member's own incident is the group's
        r = m.report
        if m.reachable and r is not None and r.cause is not None:
            p = _stopped(r)
            # A worker's server exits when its ranks die (its main has nothing else to run): for the
            # group that is a dead rank, and node 0's ranks now hang in their next collective.
            cause = "rank_died" if r.cause == "exited" else r.cause
            absent = _absent_for(r, members)
            if absent is not None:
                why = f"node {m.node}: {r.reason}; {absent[0]}"
                return GroupVerdict("incident", cause, why, node=absent[1], stalled_for=m.node)
            alike = _alike(own, members, m.node, r.cause)
            return GroupVerdict(
                "incident",
                cause,
                f"node {m.node}: {r.reason}" + (_alike_text(alike, r.phase) if alike else ""),
                node=m.node,
                rank=p.rank if p is not None else None,
                alike=alike,
            )
    if own.status == "incident" and own.cause is not None:
        if own.cause in _STALLS or own.cause == "exited":
            why, node, rank = _explain(own, members)
            if node is not None:
                return GroupVerdict("incident", own.cause, f"{own.reason}; {why}", node=node, rank=rank)
        alike = _alike(own, members, 0, own.cause)
        why = f"node 0: {own.reason}" + (_alike_text(alike, own.phase) if alike else "")
        return GroupVerdict("incident", own.cause, why, node=0, alike=alike)
    named: list[int] = []
    parts: list[str] = []
    for m in members:
        r = m.report
        if not m.reachable and m.unreachable_s >= unreachable_s:
            named.append(m.node)
            parts.append(f"node {m.node} daemon unreachable for {m.unreachable_s:.0f} s ({m.error or 'no answer'})")
        elif m.reachable and r is not None and own.state in SERVING_NAMES and r.state not in SERVING_NAMES:
            named.append(m.node)
            parts.append(f"node {m.node} is {r.state}")
    if named:
        return GroupVerdict("degraded", reason="; ".join(parts), degraded=tuple(named))
    return GroupVerdict("ok", reason="every node reports")


def group_serves(own_state: str, members: tuple[MemberView, ...]) -> bool:
    """`/readyz` on the leader: node 0 serves and no member that answers says its server is down.
    A member that cannot be asked does not make the group unready (a partition of the daemons is
    not one of the servers); a member that answers `starting`, `hung` or `stopped` does."""
    if own_state not in SERVING_NAMES:
        return False
    return all(not m.reachable or m.report is None or m.report.state in SERVING_NAMES for m in members)
