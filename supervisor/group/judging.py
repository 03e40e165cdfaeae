"""The group leader's reading of a poll (docs/MULTINODE.md): node 0's own verdict combined with its
members' reports into the verdict the owner acts on, and the rules that hold it.

A worker holds its own incident for the leader. The leader waits for a node away, late or
partitioned (up to `absent_wait_s`, the node named), gives node 0's server a moment once a
partition heals, waits for fresh reports before it blames node 0 for a crash, relaunches members on
another rung, and says why an incident is not the servers' fault (`Judged.same_rung`: the group
relaunches on its rung, spending no retry) or is (a fault every node showed: the ladder judges it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import replace

from supervisor.group.client import Answer
from supervisor.group.joining import Mismatch, mismatches
from supervisor.group.peers import Judged, Record
from supervisor.group.runtime import GroupRuntime
from supervisor.group.verdict import GroupVerdict, OwnVerdict, combine
from supervisor.policy.watchdog import Verdict


def judge(g: GroupRuntime, v: Verdict, own_state: str, record: Record) -> Judged:
    """The verdict the owner acts on. A worker holds an incident; the leader gets the group's
    verdict (a member's incident, or its own named by the members, or `degraded`, named)."""
    if not g.is_leader:
        if not v.is_incident:
            return Judged(v)
        g.held_cause, g.held_reason = v.cause, v.reason
        record("group_member_incident", "warning", cause=v.cause, reason=v.reason, node=g.node)
        return Judged(None, f"{v.cause}: {v.reason}; held for the group's leader (node 0), which restarts the group")
    assert g.leader is not None
    # Node 0's server failing: an incident, and held so through a degraded poll (a health check that
    # failed fewer times in a row than the incident needs); a healthy or starting verdict ends it.
    if v.is_incident:
        g.own_failing = v.reason
    elif v.status != "degraded":
        g.own_failing = ""
    for m in g.leader.views():  # who answers at each node's address: kept across stops and launches
        if m.reachable and m.report is not None and m.report.identity:
            g.holders[m.node] = m.report.identity
    own = OwnVerdict(own_state, v.status, v.cause, v.reason, v.phase)
    gv = combine(own, g.leader.views(), g.settings.unreachable_s)
    if gv.stalled_for is not None and gv.node is not None:
        g.stalled_for_absent[gv.stalled_for] = gv.node
    rejoin = _rejoin(g, gv, own_state)
    if rejoin is not None:
        gv = rejoin
    elif not gv.is_incident:
        gv = _mismatched(g, gv, own_state, record)
    before, g.verdict = g.verdict, gv
    # On change only: which nodes are named, not how long they have been (the reason counts seconds).
    if gv.status != before.status or gv.degraded != before.degraded:
        if gv.status == "degraded":
            record("group_degraded", "warning", reason=gv.reason, nodes=list(gv.degraded))
        elif gv.status == "ok" and before.status == "degraded":
            record("group_recovered", reason=gv.reason)
    _alert_absent(g, record)
    same_rung = ""  # why the servers are not at fault, naming the node: the group relaunches on its rung
    if rejoin is not None:  # a node came back without its server: not the servers' fault
        same_rung = f"node {rejoin.node} came back without its server"
        g.waiting_since = g.waiting_for = None
        g.healing, g.gone = None, set()
    elif gv.is_incident:
        if _elsewhere(g, gv) is not None:  # node 0 waits at the rendezvous for a member of an old group
            _mismatched(g, gv, own_state, record)  # relaunched on the group's rung; the stall waits for it
        waiting = _waits_for_absent(g, gv, v, own_state, record)
        if waiting is not None:
            return waiting
        settling = _healing(g, gv, v, own_state)
        if settling is not None:
            return settling
        # It waited for that node, or that node runs no server through no fault of its own (its daemon
        # came back without it, or it was stopped): node 0's server lost a peer; the rung is not the cause.
        # A node that showed the fault itself is never "away": the ladder judges it (issue 54).
        waited_for = g.waiting_for is not None or gv.node in g.stalled_for_absent
        if (waited_for or _serverless(g, gv)) and not _showed_fault(g, gv):
            same_rung = _not_the_servers(g, gv)
        if same_rung and g.waiting_for not in (None, gv.node):  # the journal names the node waited for
            gv = replace(gv, reason=f"{gv.reason}; node {g.waiting_for} was waited for {_waited(g)}")
        elif same_rung and gv.node in g.stalled_for_absent:
            absent = g.stalled_for_absent[gv.node]
            gv = replace(gv, reason=f"{gv.reason}; it stalled waiting for node {absent}, absent: not the rung's")
        g.waiting_since = g.waiting_for = None
        g.healing, g.gone = None, set()
    else:
        g.waiting_since = g.waiting_for = None
        g.healing, g.gone = None, set()
    confirming = _confirming(g, gv, v, own_state)
    if confirming is not None:
        return confirming
    if gv.is_incident:
        if gv.node not in (None, 0) or not v.is_incident or gv.alike:
            alike = {"alike": list(gv.alike)} if gv.alike else {}
            record("group_incident", "warning", cause=gv.cause, node=gv.node, rank=gv.rank, reason=gv.reason, **alike)
        return Judged(
            Verdict(
                "incident",
                gv.cause,
                gv.reason,
                stall_class=v.stall_class,
                phase=v.phase,
                moved=v.moved,
                figures=v.figures,
            ),
            same_rung=same_rung,
        )
    if gv.status == "degraded" and v.status == "ready":
        return Judged(Verdict("degraded", reason=f"group: {gv.reason}", phase=v.phase))
    return Judged(v)


def _rejoin(g: GroupRuntime, gv: GroupVerdict, own_state: str) -> GroupVerdict | None:
    """A member that asked to launch after node 0's server formed its group came back without the
    server it was formed with (its daemon restarted and adopted nothing): node 0's server waits on
    ranks that are gone and can never take new ones. The group's incident, naming that node, on the
    same rung (issue 34: a node lost and back moves no ladder); a member's own incident elsewhere
    comes first."""
    if not g.rejoined or own_state not in ("starting", "ready", "degraded"):
        return None
    if gv.is_incident and gv.node not in (None, 0, *g.rejoined):
        return None
    node = min(g.rejoined)
    return GroupVerdict("incident", "rank_died", f"node {node}: {g.rejoined[node]}", node=node)


def _waits_for_absent(g: GroupRuntime, gv: GroupVerdict, v: Verdict, own_state: str, record: Record) -> Judged | None:
    """Absence is not failure (issue 34): a stall explained by a node whose daemon cannot be asked
    (away, late, partitioned) waits for it, `degraded` or `starting` and named, up to
    `absent_wait_s`; then the incident goes ahead, naming the node, on the same rung."""
    assert g.leader is not None
    elsewhere = _elsewhere(g, gv)
    node = gv.node if elsewhere is None else elsewhere
    views = {m.node: m for m in g.leader.views()}
    m = views.get(node) if node not in (None, 0) else None
    if m is None:
        return None
    r = m.report
    # A node still coming up (it started late, or waits for this leader's word) is judged by its
    # own watchdog: it holds its own stall if it has one. The leader's start-up stall waits for it
    # as for a node away.
    late = (
        m.reachable and r is not None and r.state in _COMING and r.cause is None
        and gv.cause in ("startup_stall", "startup_timeout")
    )  # fmt: skip
    if m.reachable and not late and elsewhere is None:
        return None
    now = g.leader.now()
    # A daemon seen before that no longer answers is a partition (or the node is down: the leader
    # cannot tell them apart); one never seen has not come yet.
    gone = not m.reachable and elsewhere is None
    condition = ("partition" if node in g.holders or r is not None else "absent") if gone else "late"
    if gone:
        g.gone.add(m.node)
    if g.waiting_for != node or g.waiting_since is None:
        g.waiting_for, g.waiting_since = node, now
        record("group_waiting", "warning", node=node, cause=gv.cause, reason=gv.reason, condition=condition)
    g.waiting_as = "elsewhere" if elsewhere is not None else condition
    waited = now - g.waiting_since
    limit = g.settings.absent_wait_s
    if waited >= limit:
        return None
    if elsewhere is not None:
        what = "on another rung than the group's, or a server from before the group's relaunch: relaunched"
    elif condition == "partition":
        what = f"partitioned {m.unreachable_s:.0f} s: {m.error or 'unreachable'}"
    else:
        what = f"its server {r.state}" if late and r is not None else (m.error or "unreachable")
    why = (
        f"group: waiting for node {node} ({what}) {waited:.0f} s of absent_wait_s {limit:g}: "
        f"a node away or late is not a server fault ({gv.reason})"
    )
    if own_state in ("ready", "degraded"):
        return Judged(Verdict("degraded", reason=why, phase=v.phase))
    return Judged(Verdict("starting", reason=why, phase=v.phase))


_COMING = ("starting", "stopped", "restarting")  # a member's server not up yet, with no fault of its own


CONFIRM_ROUNDS = 2  # poll rounds begun after node 0's own incident: the first may have been under way


def _healing(g: GroupRuntime, gv: GroupVerdict, v: Verdict, own_state: str) -> Judged | None:
    """The node waited for answers again (a partition healed) while node 0's own incident stands:
    node 0's server is given CONFIRM_ROUNDS poll rounds (bounded in time) to recover on its own,
    before the group relaunches on its rung (issue 54: a 30 s partition forced a whole-group
    relaunch once it healed)."""
    assert g.leader is not None
    node = g.waiting_for
    if node is None or node not in g.gone:  # a late node's or another rung's wait is not a partition's
        return None
    m = {x.node: x for x in g.leader.views()}.get(node)
    if m is None or not m.reachable or gv.node not in (None, 0, node):
        return None
    polls, now = g.leader.polls, g.leader.now()
    if g.healing is None or g.healing[0] != node:
        g.healing = (node, polls, now)
    _, first, since = g.healing
    if polls >= first + CONFIRM_ROUNDS or now - since >= CONFIRM_ROUNDS * (g.settings.request_timeout_s + 1.0) + 2.0:
        return None
    why = f"group: node {node} answers again: node 0's server is given a moment to recover ({gv.reason})"
    return Judged(Verdict("degraded" if own_state in ("ready", "degraded") else "starting", reason=why, phase=v.phase))
# node 0's own crash: a member's crash breaks node 0's collectives at once (gloo raises), and its own
# watchdog says so a poll later; a stall's window is long enough for every member's report to be fresh
_CRASHES = frozenset({"exited", "rank_died"})


def _confirming(g: GroupRuntime, gv: GroupVerdict, v: Verdict, own_state: str) -> Judged | None:
    """Node 0 named for its own crash (its server exited, a rank died) while members answer: it
    first waits for a report from every member taken after it (two poll rounds, at most a few
    request timeouts). A member's crash is often seen at node 0 first (its collective breaks at
    once, the member's own watchdog a poll later): then the member is named, not the healthy node 0
    (issue 54)."""
    assert g.leader is not None
    views = g.leader.views()
    crashed = gv.cause in _CRASHES and gv.node == 0 and not gv.alike
    if not (gv.is_incident and crashed and any(m.reachable for m in views)):
        g.confirm_from = None
        return None
    polls, now = g.leader.polls, g.leader.now()
    if g.confirm_from is None:
        g.confirm_from = (polls, now)
    first, since = g.confirm_from
    cap = CONFIRM_ROUNDS * (g.settings.request_timeout_s + 1.0) + 2.0
    if polls >= first + CONFIRM_ROUNDS or now - since >= cap:
        g.confirm_from = None  # the incident goes ahead; a later one asks again
        return None
    why = f"group: node 0's {gv.cause}: a report from every member first, to name the right node ({gv.reason})"
    return Judged(Verdict("degraded" if own_state in ("ready", "degraded") else "starting", reason=why, phase=v.phase))


def _waited(g: GroupRuntime) -> str:
    assert g.leader is not None
    since = g.waiting_since if g.waiting_since is not None else g.leader.now()
    return f"{g.leader.now() - since:.0f} s (absent_wait_s {g.settings.absent_wait_s:g}): not a fault of the rung"


_WAITED_AS = {
    "partition": "partitioned",
    "absent": "absent",
    "late": "late",
    "elsewhere": "on another rung, or left from before the group's relaunch",
}


def _not_the_servers(g: GroupRuntime, gv: GroupVerdict) -> str:
    """Why a group incident is not the servers' fault, naming the node (the `ladder_decision`'s
    reason: issue 54 booked a partition as "a node was away")."""
    assert g.leader is not None
    if g.waiting_for is not None:
        since = g.waiting_since if g.waiting_since is not None else g.leader.now()
        what = _WAITED_AS.get(g.waiting_as, "away")
        return f"node {g.waiting_for} was {what} ({g.leader.now() - since:.0f} s waited)"
    if gv.node in g.stalled_for_absent:
        return f"node {gv.node} stalled waiting for node {g.stalled_for_absent[gv.node]}, which was absent"
    return f"node {gv.node} runs no server through no fault of its own (lost and back, or stopped)"


def _showed_fault(g: GroupRuntime, gv: GroupVerdict) -> bool:
    """Whether a member showed the group's fault itself (it holds its own incident, or joined and
    stalled alike with node 0): the servers' fault, judged by the ladder as one node's would be."""
    assert g.leader is not None
    if any(n != 0 for n in gv.alike):
        return True
    m = {v.node: v for v in g.leader.views()}.get(gv.node) if gv.node not in (None, 0) else None
    r = m.report if m is not None and m.reachable else None
    if r is None or r.cause is None:
        return False
    # A member that stalled at the rendezvous waiting for an absent node: that node's.
    return gv.node not in g.stalled_for_absent


def _serverless(g: GroupRuntime, gv: GroupVerdict) -> bool:
    """The group's incident names a member that answers, runs no server (stopped, or held before
    its launch) and holds no incident of its own: a node lost and back that has not asked to join
    yet (the order a loaded machine gave: node 0's health failed first, CI 2026-12-06), or a member
    stopped by hand. Node 0's server waits on ranks that are gone: not a fault of the rung."""
    assert g.leader is not None
    if gv.node in (None, 0):
        return False
    m = {v.node: v for v in g.leader.views()}.get(gv.node)
    r = m.report if m is not None else None
    return m is not None and m.reachable and r is not None and r.state in ("stopped", "restarting") and r.cause is None


def _elsewhere(g: GroupRuntime, gv: GroupVerdict) -> int | None:
    """A member that explains node 0's start-up stall by serving another rung (its server from
    before a group relaunch, adopted) or by being relaunched onto the group's now: node 0 waits at
    the rendezvous for it. That member is relaunched (`group_mismatch`), not the group (issue 34)."""
    assert g.leader is not None
    if gv.cause not in ("startup_stall", "startup_timeout") or gv.node not in (None, 0):
        return None
    if g.fixing:
        return min(g.fixing)
    views = {m.node: m for m in g.leader.views()}
    for node in sorted(g.relaunched):  # relaunched before node 0's stall came: still coming up
        w, r = views.get(node), views[node].report if node in views else None
        if w is not None and w.reachable and (r is None or (r.state in _COMING and r.cause is None)):
            return node
    w = views.get(g.waiting_for) if g.waiting_for is not None else None
    if w is not None and w.reachable and w.report is None:  # relaunched; its first report is to come
        return w.node
    found = [m.node for m in _relaunches(g) if m.relaunch is not None]
    return found[0] if found else None


def _relaunches(g: GroupRuntime) -> tuple[Mismatch, ...]:
    """Members to relaunch on the group's rung: on another rung, or running a server from before the
    group's last relaunch (they missed its stop: partitioned), which can never meet node 0's."""
    assert g.leader is not None
    views = g.leader.views()
    found = list(mismatches(views, g.own_rung, g.fingerprint))
    named = {m.node for m in found}
    for m in views:
        r = m.report
        if m.node not in g.missed or m.node in named or not g.own_rung or not m.reachable or r is None:
            continue
        if r.pid is not None and r.cause is None and r.state in ("starting", "ready", "degraded"):
            why = f"node {m.node} runs a server from before the group's relaunch (it missed the group's stop)"
            found.append(Mismatch(m.node, why, g.own_rung))
    return tuple(found)


def _alert_absent(g: GroupRuntime, record: Record) -> None:
    """A member away past `absent_alert_s` is journalled once (`group_node_absent`), until it answers."""
    assert g.leader is not None
    for m in g.leader.views():
        if m.reachable:
            g.absent_named.discard(m.node)
        elif m.unreachable_s >= g.settings.absent_alert_s and m.node not in g.absent_named:
            g.absent_named.add(m.node)
            record(
                "group_node_absent", "warning", node=m.node, address=m.address,
                unreachable_s=round(m.unreachable_s, 1), error=m.error,
            )  # fmt: skip


def _mismatched(g: GroupRuntime, gv: GroupVerdict, own_state: str, record: Record) -> GroupVerdict:
    """Members on another rung are relaunched on the group's (`group_mismatch`, not a ladder step);
    members whose config differs are named. Either makes the group `degraded`, named."""
    assert g.leader is not None
    if own_state not in ("starting", "ready", "degraded"):
        return gv
    views = g.leader.views()
    g.relaunched -= {m.node for m in views if m.report is not None and m.report.state not in _COMING}
    found = _relaunches(g)
    named = {m.node: m.reason for m in found if m.node not in g.fixing}
    for m in found:
        if m.node in g.fixing:
            continue
        if g.mismatched.get(m.node) != m.reason:
            record("group_mismatch", "warning", node=m.node, reason=m.reason, relaunch=m.relaunch)
        if m.relaunch is not None:
            g.fixing.add(m.node)
            g.tasks.add(asyncio.ensure_future(_relaunch(g, m.node, m.relaunch, record)))
    g.mismatched = named
    if not named:
        return gv
    nodes = tuple(sorted({*gv.degraded, *named}))
    reason = "; ".join(x for x in (gv.reason if gv.status == "degraded" else "", *named.values()) if x)
    return GroupVerdict("degraded", reason=reason, degraded=nodes)


async def _relaunch(g: GroupRuntime, node: int, rung: str, record: Record) -> None:
    assert g.leader is not None
    try:
        stop, launch = await g.leader.relaunch_one(node, rung)
        answers = [a for a in (stop, launch) if a is not None]
        ok = all(a.ok for a in answers)
        record("group_launch", "info" if ok else "warning", rung=rung, nodes=nodes_of(answers), mismatch=True)
        if ok:
            g.relaunched.add(node)
            g.missed.discard(node)
    except Exception as err:  # the poller and the loop outlive a failed relaunch; the next report retries
        record("group_launch", "warning", rung=rung, nodes=[{"node": node, "ok": False, "error": repr(err)[:300]}])
    finally:
        g.fixing.discard(node)
        g.mismatched.pop(node, None)


def nodes_of(answers: Iterable[Answer]) -> list[dict[str, object]]:
    return [
        {"node": a.node, "address": a.address, "ok": a.ok, "error": a.error or None, "s": round(a.elapsed_s, 3)}
        for a in answers
    ]
