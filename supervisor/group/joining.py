"""One rung and one config for the group (issue 34): the leader's answer to a member that asks
before it launches (`POST /group/join`), and its check of every member's report. Pure.

Only the leader decides a rung. A member asks before any launch it was not told to make; the
leader answers its own rung while its server is up (`launch`), `wait` while it is restarting,
stopped or failed (it launches the members itself when the group launches), and `refused` when
the member's group-relevant config differs (naming the keys) or another daemon already answers
for that node_rank. A member that asks while node 0's server has already formed its group came
back without the server it formed it with (its daemon restarted and adopted nothing): a new server
there could never join, so it waits and the group is relaunched together (`rejoin`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from supervisor.group.fingerprint import differing
from supervisor.group.verdict import PHASES, MemberView

JoinVerdict = Literal["launch", "wait", "refused"]
_UP = frozenset({"starting", "ready", "degraded"})
_RENDEZVOUS = PHASES.index("initializing")  # the phase in which the ranks of every node meet


@dataclass(frozen=True)
class JoinAnswer:
    verdict: JoinVerdict
    rung: str | None = None
    reason: str = ""
    differs: tuple[str, ...] = ()
    rejoin: bool = False  # `wait`: the member came back after node 0's group formed; the group relaunches


def formed(own_state: str, own_phase: str | None) -> bool:
    """Node 0's server has met every node's ranks at the rendezvous: it serves, or it starts past the
    rendezvous' phase. A server that formed its group takes no new member: torch's store answers no
    latecomer, and the old member's ranks are what its collectives wait for."""
    if own_state in ("ready", "degraded"):
        return True
    return own_state == "starting" and own_phase in PHASES and PHASES.index(own_phase) > _RENDEZVOUS


def answer_join(
    node: int,
    instance: str,
    theirs: Mapping[str, str],
    mine: Mapping[str, str],
    members: Sequence[MemberView],
    own_state: str,
    own_rung: str | None,
    *,
    check: bool = False,
    group_formed: bool = False,
    identity: str = "",
    holder: str = "",
    address: str = "",
) -> JoinAnswer:
    """`check`: only asked (check-config --group, maybe beside the node's running daemon): the
    config is compared, the node_rank's daemon is not. `group_formed`: node 0's server has formed
    its group (`formed`), so a member asking to launch is one that came back without its server.
    `identity`: the joining daemon's state directory (stable across its restarts); `holder`: the
    identity the node_rank's configured address last reported, kept across the group's stops and
    launches (which drop the reports): one identity per node_rank while that address answers."""
    differs = tuple(differing(mine, theirs))
    if differs:
        why = f"node {node}'s group config differs from the leader's: " + "; ".join(differs)
        return JoinAnswer("refused", reason=why, differs=differs)
    for m in members:
        if check:
            break
        if m.node != node or not m.reachable:
            continue
        other = _other_daemon(m, instance, identity, holder)
        if other is not None:
            me = ", ".join(x for x in (f"at {address}" if address else "", _state(identity)) if x)
            why = (
                f"node_rank {node} is already the daemon at {m.address} ({other}); this daemon"
                f"{f' ({me})' if me else ''} claims it too: "
                "two daemons claim one node_rank: give this one its own"
            )
            return JoinAnswer("refused", reason=why)
    if group_formed and not check and own_rung:
        why = (
            f"node 0's server formed its group on rung {own_rung} before this daemon's server (node 0 is "
            f"{own_state}): a new node {node} cannot join it, so the group is relaunched together on rung {own_rung}"
        )
        return JoinAnswer("wait", reason=why, rejoin=True)
    if own_state in _UP and own_rung:
        return JoinAnswer("launch", own_rung, f"the group runs rung {own_rung}")
    return JoinAnswer("wait", reason=f"the leader is {own_state}: it launches the members when the group launches")


def _state(identity: str) -> str:
    return f"state directory id {identity[:12]}" if identity else ""


def _other_daemon(m: MemberView, instance: str, identity: str, holder: str) -> str | None:
    """The daemon at the node_rank's address, named, when it is not the one joining: by identity
    where both have one (a restart of the same daemon keeps it), else by the daemon's life."""
    r = m.report
    known = r.identity if r is not None and r.identity else holder
    if identity and known:
        if known == identity:
            return None
    elif r is None or not r.instance or r.instance == instance:
        return None
    pid = f"pid {r.pid}" if r is not None else "pid not reported since the group's last stop or launch"
    return f"{pid}{', ' + _state(known) if known else ''}"


@dataclass(frozen=True)
class Mismatch:
    node: int
    reason: str
    relaunch: str | None  # the group's rung to relaunch that node on; None: named only (its config differs)


def mismatches(members: Sequence[MemberView], own_rung: str | None, mine: Mapping[str, str]) -> tuple[Mismatch, ...]:
    """Members whose running server is not the group's: another rung (relaunched on the group's),
    or the same rung from another config (named; relaunching would run the same other command)."""
    out: list[Mismatch] = []
    if not own_rung:
        return ()
    for m in members:
        r = m.report
        if not m.reachable or r is None or r.state not in _UP or r.pid is None or r.cause is not None:
            continue
        if r.rung != own_rung:
            out.append(Mismatch(m.node, f"node {m.node} runs rung {r.rung!r}, the group rung {own_rung!r}", own_rung))
            continue
        if r.fingerprint:
            differs = differing(mine, r.fingerprint)
            if differs:
                out.append(Mismatch(m.node, f"node {m.node}'s config differs: " + "; ".join(differs), None))
    return tuple(out)


def lacking(rung: str, members: Sequence[MemberView]) -> str | None:
    """The members whose config (their last report's fingerprint) has no rung `rung`, named: the
    group cannot launch it there, so a restart to it is refused before anything stops (issue 34).
    None: every member that reported has it (one with no report is asked when it launches)."""
    lack = [
        f"node {m.node} ({m.address}) has no rung {rung!r} (its ladder: {m.report.fingerprint.get('ladder', '?')})"
        for m in members
        if m.report is not None and m.report.fingerprint and f"rung.{rung}" not in m.report.fingerprint
    ]
    if not lack:
        return None
    return (
        "; ".join(lack)
        + ": the group cannot launch it, nothing was stopped; give every node that rung (reload its config) "
        "or choose one they all have"
    )
