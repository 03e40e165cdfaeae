"""`/status` `group` from a daemon's group state, and the `/readyz` rule that reads it."""

from __future__ import annotations

from supervisor.group.runtime import GroupRuntime
from supervisor.group.verdict import MemberView, group_serves
from supervisor.policy.lifecycle import SERVING_NAMES
from supervisor.status.snapshot import GroupNodeView, GroupView, StatusSnapshot


def _member(m: MemberView) -> GroupNodeView:
    r = m.report
    return GroupNodeView(
        node=m.node,
        address=m.address,
        reachable=m.reachable,
        unreachable_s=round(m.unreachable_s, 3),
        error=m.error,
        state=r.state if r else None,
        phase=r.phase if r else None,
        pid=r.pid if r else None,
        rung=r.rung if r else None,
        cause=r.cause if r else None,
        stopped_ranks=tuple(p.pid for p in r.ranks if p.status == "stopped") if r else (),
        incident=r.incident if r else None,
    )


def group_view(g: GroupRuntime, own: StatusSnapshot) -> GroupView:
    me = GroupNodeView(
        node=g.node,
        state=own.state,
        phase=own.phase,
        pid=own.pid,
        rung=own.rung,
        cause=g.held_cause if own.state in ("hung", "diagnosing") else None,
        stopped_ranks=tuple(p.pid for p in own.processes if p.status == "stopped"),
        incident=g.captured,
    )
    members = g.leader.views() if g.leader is not None else ()
    serves = group_serves(own.state, members) if g.leader is not None else own.state in SERVING_NAMES
    # Node 0's own server failing (its incident held while the group waits for a node) serves nothing,
    # whatever the group waits for (issue 54). A worker's held incident is its state (`hung`) already.
    serves = serves and not g.own_failing
    return GroupView(
        role="leader" if g.is_leader else "worker",
        node_rank=g.node,
        nnodes=g.settings.nnodes,
        restart=g.settings.restart,
        leader=g.settings.leader,
        status=g.verdict.status if g.is_leader else "ok",
        reason=g.verdict.reason if g.is_leader else "",
        serves=serves,
        nodes=(me, *(_member(m) for m in members)),
    )
