"""A daemon's part in a multi-node group (docs/MULTINODE.md): what the owner asks of its group.

A worker (node_rank >= 1) never acts on its own verdict: it holds it (`hung`, waiting for the
leader), reports it, and captures, stops and launches when the leader asks. The leader combines
its own verdict with its members' reports (supervisor.group.verdict), and on a group incident asks
every member at once: capture under the same incident id, stop and verify, launch one rung.

`GroupPeers` is the owner's `Peers` (supervisor.group.peers) in a group: the owner
(`supervisor.daemon.owner.Owner`) calls it at its named points; it takes the group's runtime and
explicit values and returns outcomes; events go out through the `record` it is handed. Nothing here
touches the server's processes: the members' daemons do, each its own.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from probes.types import Observation
from supervisor.common.exitcodes import EXIT_GROUP_RESTART
from supervisor.config.settings import Settings
from supervisor.group.client import Answer, GroupClient
from supervisor.group.credentials import load_keys
from supervisor.group.fingerprint import fingerprint
from supervisor.group.joining import JoinAnswer, Mismatch, answer_join, formed, lacking, mismatches
from supervisor.group.leader import GroupLeader, Timeouts
from supervisor.group.peers import Asked, Beating, Clearance, Judged, MemberApi, NoPeers, Record
from supervisor.group.report import build_report
from supervisor.group.runtime import GroupRuntime, state_identity
from supervisor.group.signing import NonceBook, RequestCheck
from supervisor.group.verdict import GroupVerdict, NodeReport, OwnVerdict, combine
from supervisor.group.view import group_view
from supervisor.policy.recovery import exits_for_group
from supervisor.policy.watchdog import History, Verdict
from supervisor.status.commands import Command, CommandResult
from supervisor.status.snapshot import StatusSnapshot

T = TypeVar("T")
_HELD_STATES = frozenset({"hung", "diagnosing"})


def make_runtime(
    settings: Settings, monotonic: Callable[[], float], wall: Callable[[], float] = time.time
) -> GroupRuntime | None:
    """The group's runtime; ConfigError (named) when the group has no credentials."""
    g = settings.group
    if g is None:
        return None
    keys = load_keys(g)
    if not g.is_leader:
        assert g.leader is not None  # the settings model requires it of a worker
        ask = GroupClient({0: g.leader}, keys, wall=wall, max_skew_s=g.max_skew_s, as_node=g.node_rank)
        worker = GroupRuntime(g, None, keys, to_leader=ask)
        worker.fingerprint = fingerprint(settings)
        worker.identity = state_identity(settings.state_dir)
        worker.address = f"{settings.api.host}:{settings.api.port}"
        return worker
    d, rs = settings.diagnostics, settings.restart
    timeouts = Timeouts(
        report_s=g.request_timeout_s,
        # a member's capture runs py-spy and gdb on every process; its stop waits out the grace and the release
        capture_s=d.py_spy_timeout_s + d.gdb_timeout_s + 30.0,
        stop_s=rs.stop_grace_s + rs.release_timeout_s + 30.0,
        launch_s=max(g.request_timeout_s, 30.0),
    )
    members = {i + 1: a for i, a in enumerate(g.members)}
    client = GroupClient(members, keys, wall=wall, max_skew_s=g.max_skew_s)
    runtime = GroupRuntime(
        g, GroupLeader(g, client, timeouts, monotonic), keys, saved_at=settings.state_dir / "group.json"
    )
    runtime.load_saved()
    runtime.fingerprint = fingerprint(settings)
    runtime.identity = state_identity(settings.state_dir)
    return runtime


def request_check(g: GroupRuntime, monotonic: Callable[[], float]) -> RequestCheck:
    """The group API's check (api/groupgate.py): a member takes the leader's requests (signed
    with its own key), the leader its members' joins (each signed with the joining node's)."""
    s = g.settings
    signers = frozenset(range(1, s.nnodes)) if g.is_leader else frozenset({g.node})
    return RequestCheck(g.keys.key, signers, s.max_skew_s, NonceBook(s.max_skew_s, monotonic))


def report(
    g: GroupRuntime, snap: StatusSnapshot, history: History | None, obs: Observation | None, wall: float
) -> NodeReport:
    """This node's report: its snapshot, the verdict it holds, the rank processes it lost."""
    held = snap.state in _HELD_STATES
    lost: set[int] = set()
    if history is not None and obs is not None:
        roles = ("scheduler", "detokenizer")
        alive = {p.pid for p in obs.tree.processes if p.role in roles and p.status != "zombie"}
        lost = set(history.ranks) - alive
    return build_report(
        g.node,
        snap,
        cause=g.held_cause if held else None,
        reason=g.held_reason if held else "",
        lost_ranks=lost,
        at=wall,
        incident=g.captured,
        instance=g.instance,
        fingerprint=g.fingerprint,
        identity=g.identity,
    )


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
        record("group_launch", "info" if ok else "warning", rung=rung, nodes=_nodes(answers), mismatch=True)
        if ok:
            g.relaunched.add(node)
            g.missed.discard(node)
    except Exception as err:  # the poller and the loop outlive a failed relaunch; the next report retries
        record("group_launch", "warning", rung=rung, nodes=[{"node": node, "ok": False, "error": repr(err)[:300]}])
    finally:
        g.fixing.discard(node)
        g.mismatched.pop(node, None)


@dataclass(frozen=True)
class JoinReading:
    """A member's reading of its leader's answer to `POST /group/join`."""

    clearance: Clearance
    accepted: bool | None  # the leader accepts this daemon (its config, its node_rank); None: no answer


def read_join(a: Answer, rung: str, by_group: bool) -> JoinReading:
    """`launch` and `wait` accept this daemon, 409 refuses it. The rung launched is the one the
    leader named: in its own launch request (`by_group`: `rung`), else in this answer."""
    if a.status == 409:
        why = f"refused by the group's leader: {str(a.body.get('detail', ''))[:600]}"
        return JoinReading(Clearance(None, why), False)
    if not a.ok:
        why = f"the group's leader ({a.address}) cannot be asked ({a.error}); not launching without it"
        return JoinReading(Clearance(None, why), None)
    verdict, given, reason = a.body.get("verdict"), a.body.get("rung"), str(a.body.get("reason", ""))[:300]
    if verdict not in ("launch", "wait"):
        return JoinReading(Clearance(None, f"the group's leader answered {str(verdict)[:40]!r}: {reason}"), None)
    if by_group:
        return JoinReading(Clearance(rung, reason), True)
    if verdict == "launch" and isinstance(given, str) and given:
        return JoinReading(Clearance(given, reason), True)
    return JoinReading(Clearance(None, f"waiting for the group's leader: {reason}"), True)


async def clearance(g: GroupRuntime, rung: str, by_group: bool, beating: Beating) -> Clearance:
    """A worker launches only once its leader has accepted this daemon and named the rung (issue
    34): the leader's launch request (`by_group`) names it, but accepts nobody, so a daemon the
    leader has not accepted (never asked, refused, or reloaded since) asks first, whoever launches."""
    if g.is_leader or g.to_leader is None or (by_group and g.accepted):
        return Clearance(rung)
    body = {
        "node": g.node, "instance": g.instance, "fingerprint": g.fingerprint, "rung": rung,
        "identity": g.identity, "address": g.address,
    }  # fmt: skip
    answers: tuple[Answer, ...] = await beating(
        g.to_leader.ask_all("POST", "/group/join", timeout=g.settings.request_timeout_s, body=body)
    )
    if answers[0].status == 422:  # a leader from before identities (a rolling upgrade): asked as it knows
        old = {k: v for k, v in body.items() if k not in ("identity", "address")}
        answers = await beating(
            g.to_leader.ask_all("POST", "/group/join", timeout=g.settings.request_timeout_s, body=old)
        )
    reading = read_join(answers[0], rung, by_group)
    if reading.accepted is not None:
        g.accepted = reading.accepted
    return reading.clearance


def answer_join_request(
    g: GroupRuntime,
    node: int,
    instance: str,
    theirs: Mapping[str, str],
    check: bool,
    record: Record,
    identity: str = "",
    address: str = "",
) -> JoinAnswer:
    """The leader's answer to a member's join (`POST /group/join`); journalled when it changes."""
    if g.leader is None:
        return JoinAnswer("refused", reason=f"node {g.node} is not the group's leader (node 0)")
    ans = answer_join(
        node,
        instance,
        theirs,
        g.fingerprint,
        g.leader.views(),
        g.own_state,
        g.own_rung,
        check=check,
        group_formed=formed(g.own_state, g.own_phase),
        identity=identity,
        holder=g.holders.get(node, ""),
        address=address,
    )
    if ans.rejoin and node not in g.rejoined:
        g.rejoined[node] = (
            f"its server is gone and its daemon came back without it; node 0's server formed its group "
            f"on rung {g.own_rung} with the old one and cannot take a new node {node}: the group is "
            f"relaunched together on rung {g.own_rung} (a node lost, not a ladder step)"
        )
    if not check and ans.verdict != "refused":
        g.missed.discard(node)  # it launches on the leader's word now: its server is the group's
    if not check and g.joins.get(node) != ans:
        g.joins[node] = ans
        if ans.verdict == "refused":
            record("group_join_refused", "warning", node=node, reason=ans.reason, differs=list(ans.differs))
        else:
            record("group_join", node=node, verdict=ans.verdict, rung=ans.rung, reason=ans.reason)
    return ans


async def join_check(settings: Settings, timeout_s: float) -> tuple[bool, str]:
    """Ask the running leader whether this node's config may join (check-config --group)."""
    g = settings.group
    assert g is not None and g.leader is not None
    keys = load_keys(g)
    client = GroupClient({0: g.leader}, keys, max_skew_s=g.max_skew_s, as_node=g.node_rank)
    body = {
        "node": g.node_rank,
        "instance": os.urandom(16).hex(),
        "fingerprint": fingerprint(settings),
        "check": True,
    }
    try:
        a = await client.ask(0, "POST", "/group/join", timeout=timeout_s, body=body)
    finally:
        await client.close()
    if a.status == 409:
        return False, f"group: refused by the leader at {g.leader}: {a.body.get('detail', '')}"
    if not a.ok:
        return False, f"group: the leader at {g.leader} cannot be asked: {a.error}"
    return True, f"group: the leader at {g.leader} agrees ({a.body.get('verdict')}: {a.body.get('reason', '')})"


def _nodes(answers: Iterable[Answer]) -> list[dict[str, object]]:
    return [
        {"node": a.node, "address": a.address, "ok": a.ok, "error": a.error or None, "s": round(a.elapsed_s, 3)}
        for a in answers
    ]


async def capture_members(g: GroupRuntime, incident_id: str, beating: Beating, record: Record) -> None:
    """Every member's bundle under the leader's incident id (the leader captures its own meanwhile)."""
    if g.leader is None:
        return
    answers: tuple[Answer, ...] = await beating(g.leader.capture_all(incident_id))
    bundles = {
        str(a.node): (str(a.body.get("bundle_id")) if a.ok and a.body.get("bundle_id") else None) for a in answers
    }
    # Each node's culprit line beside its bundle: the group's summary names the stuck thread per node.
    culprits = {str(a.node): str(a.body["culprit"]) for a in answers if a.ok and a.body.get("culprit")}
    level = "info" if all(a.ok for a in answers) else "warning"
    record("group_evidence", level, id=incident_id, bundles=bundles, culprits=culprits, nodes=_nodes(answers))


async def together(own: Awaitable[T], members: Awaitable[None]) -> T:
    """This node's part and the members' at the same moment; this node's outcome."""
    task = asyncio.ensure_future(members)
    try:
        return await own
    finally:
        await task


def exit_for_lws(g: GroupRuntime, record: Record) -> bool:
    """`restart = "lws"`: the group's evidence is written; the leader exits for LWS to recreate the group."""
    if not exits_for_group(g.leader is not None, g.settings.restart):
        return False
    g.exit_code = EXIT_GROUP_RESTART
    record(
        "group_exit", "warning", code=EXIT_GROUP_RESTART, reason="restart = lws: LeaderWorkerSet recreates the group"
    )
    return True


async def members_running(g: GroupRuntime, beating: Beating) -> bool:
    """Whether a member that answers now runs a server, or holds a verdict about one (asked now: the
    poller may not have asked yet at a daemon's start)."""
    if g.leader is None:
        return False
    await beating(g.leader.refresh())
    return any(
        m.reachable and m.report is not None and (m.report.pid is not None or m.report.cause is not None)
        for m in g.leader.views()
    )


async def stop_members(g: GroupRuntime, beating: Beating, record: Record) -> None:
    """Every member stops and verifies its tree; the leader's next launch launches them again."""
    if g.leader is None:
        return
    g.mark_members_stopped(True)
    g.rejoined.clear()  # the group relaunches: a member that came back is launched with it
    g.stalled_for_absent.clear()  # and every member's held stall ends with it
    answers: tuple[Answer, ...] = await beating(g.leader.stop_all())
    g.missed = (g.missed | {a.node for a in answers if not a.ok}) - {a.node for a in answers if a.ok}
    record("group_stop", "info" if all(a.ok for a in answers) else "warning", nodes=_nodes(answers))


async def launch_members(g: GroupRuntime, rung: str, beating: Beating, record: Record) -> None:
    """The members the leader stopped launch the rung it launches: the ladder moves for the group."""
    if g.leader is None or not g.members_stopped:
        return
    g.mark_members_stopped(False)
    answers: tuple[Answer, ...] = await beating(g.leader.launch_all(rung))
    g.missed -= {a.node for a in answers if a.ok}  # launched now: its server is the group's
    record("group_launch", "info" if all(a.ok for a in answers) else "warning", rung=rung, nodes=_nodes(answers))


@dataclass(frozen=True)
class GroupEndpoint:
    """What api/group.py sees of the daemon (its `GroupHandle`)."""

    snapshot: Callable[[], StatusSnapshot]
    group_report: Callable[[], NodeReport]
    submit_command: Callable[[Command], Awaitable[CommandResult]]
    join_request: Callable[..., JoinAnswer] | None = None

    def join(
        self,
        node: int,
        instance: str,
        fingerprint: Mapping[str, str],
        check: bool,
        identity: str = "",
        address: str = "",
    ) -> JoinAnswer:
        if self.join_request is None:
            return JoinAnswer("refused", reason="this node is not the group's leader")
        return self.join_request(node, instance, fingerprint, check, identity, address)

    async def submit(self, command: Command) -> CommandResult:
        return await self.submit_command(command)


def bundle_doc(g: GroupRuntime | None, incident_id: str) -> Mapping[str, object] | None:
    return g.bundle_doc(incident_id) if g is not None else None


def _unattached(*args: Any, **fields: Any) -> None:
    raise RuntimeError("GroupPeers.attach was not called: the owner attaches its record and heartbeat")


async def _unattached_await(work: Awaitable[Any]) -> Any:
    raise RuntimeError("GroupPeers.attach was not called: the owner attaches its record and heartbeat")


class GroupPeers(NoPeers):
    """The owner's peers on a worker of a multi-node group (docs/MULTINODE.md), and what a leader
    shares with it; its own start, capture, stop and launch are a single node's (`NoPeers`).

    A worker holds its own incident (`hung`, for the leader) instead of acting on it, is not scraped
    for token counters (its /metrics is SGLang's dummy health server's), never promotes itself, and
    captures a bundle under the leader's id when asked; its own capture, stop and launch are the
    plain owner's. The leader is `LeaderPeers`."""

    def __init__(self, runtime: GroupRuntime) -> None:
        self.runtime = runtime
        self.record: Record = _unattached
        self.beating: Beating = _unattached_await

    def attach(self, record: Record, beating: Beating) -> None:
        self.record, self.beating = record, beating

    def fit(self, settings: Settings) -> Settings:
        g = settings.group
        if g is not None:  # a reload may change the ladder or the args: the next report says so
            new = fingerprint(settings)
            if new != self.runtime.fingerprint:  # the leader accepted the old config, not this one
                self.runtime.fingerprint, self.runtime.accepted = new, False
        if g is None or g.is_leader:
            return settings
        rs = settings.restart  # a promotion back up is the leader's, for the group
        if rs.promote_after_s > 0:
            return settings.model_copy(update={"restart": rs.model_copy(update={"promote_after_s": 0.0})})
        return settings

    def scrapes_metrics(self) -> bool:
        return self.runtime.is_leader

    def judge(self, v: Verdict, own_state: str) -> Judged:
        return judge(self.runtime, v, own_state, self.record)

    async def clearance(self, rung: str, by_group: bool) -> Clearance:
        # A launch ends the verdict this node held for the old server: a later bundle or report
        # gives its own cause, not the old one's (issue 34).
        self.runtime.held_cause, self.runtime.held_reason = None, ""
        return await clearance(self.runtime, rung, by_group, self.beating)

    def publish(self, snap: StatusSnapshot) -> StatusSnapshot:
        self.runtime.own_state, self.runtime.own_rung, self.runtime.own_phase = snap.state, snap.rung, snap.phase
        if snap.pid is not None:
            self.runtime.served = True
        return snap.model_copy(update={"group": group_view(self.runtime, snap)})

    def bundle_doc(self, incident_id: str) -> Mapping[str, object] | None:
        return self.runtime.bundle_doc(incident_id)

    def exits_for_group(self) -> bool:
        return exit_for_lws(self.runtime, self.record)

    def refuses_reload(self, new: Settings, old: Settings) -> str | None:
        """A reload cannot re-form a group (its members, its rank, its poller): refused, named."""
        if new.group != old.group:
            return "[group] changed: a reload cannot re-form the group; restart the daemon (systemctl restart)"
        return None

    def asked(self, cmd: Command) -> Asked | None:
        if cmd.source != "group" or cmd.incident_id is None:
            return None
        self.runtime.captured = cmd.incident_id
        return Asked(self.runtime.held_cause)

    def report(self, snap: StatusSnapshot, history: History | None, obs: Observation | None, wall: float) -> NodeReport:
        return report(self.runtime, snap, history, obs, wall)

    def member_api(self, monotonic: Callable[[], float]) -> MemberApi:
        return MemberApi(False, None, request_check(self.runtime, monotonic))

    @property
    def exit_code(self) -> int | None:
        return self.runtime.exit_code


class LeaderPeers(GroupPeers):
    """Node 0's peers: it polls its members beside the loop, acts on the group's verdict, answers
    joins, and does every incident's capture, stop and launch with all its members at once."""

    def __init__(self, runtime: GroupRuntime) -> None:
        assert runtime.leader is not None
        super().__init__(runtime)
        self.leader = runtime.leader

    async def start(self, poll_interval_s: Callable[[], float], sleep: Callable[[float], Awaitable[None]]) -> None:
        g = self.runtime
        self.leader.start(poll_interval_s, sleep)
        self.record("group_started", node=g.node, nnodes=g.settings.nnodes, members=list(g.settings.members))

    async def close(self) -> None:
        await self.leader.close()

    async def capture(self, incident_id: str, own: Awaitable[T]) -> T:
        self.runtime.captured = incident_id  # every member's bundle at the same moment as this one
        return await together(own, capture_members(self.runtime, incident_id, self.beating, self.record))

    async def capture_alone(self, incident_id: str) -> None:
        self.runtime.captured = incident_id
        await capture_members(self.runtime, incident_id, self.beating, self.record)

    async def stop(self, own: Awaitable[bool]) -> bool:
        return await together(own, stop_members(self.runtime, self.beating, self.record))

    async def launch(self, rung: str) -> None:
        g, beating, record = self.runtime, self.beating, self.record
        if not g.served:
            # This daemon's first node 0 server, none adopted (a successor whose node 0 server died
            # with its predecessor or was stopped as a leftover): a member that runs a server met the
            # old node 0 at the rendezvous, or waits for it there, and can never take the new one. The
            # group starts together: every member is stopped and launched with it, on this rung
            # (issue 34: node 0 lost and back moves no ladder). A first start finds none running.
            g.served = True
            if await members_running(g, beating):
                await stop_members(g, beating, record)
        await launch_members(g, rung, beating, record)

    def join(
        self, node: int, instance: str, theirs: Mapping[str, str], check: bool, identity: str = "", address: str = ""
    ) -> JoinAnswer:
        return answer_join_request(self.runtime, node, instance, theirs, check, self.record, identity, address)

    def refuses_command(self, cmd: Command) -> str | None:
        """The leader refuses a start or restart to a rung a member's config lacks (issue 34)."""
        if cmd.kind not in ("start", "restart") or not cmd.rung or cmd.source == "group":
            return None
        return lacking(cmd.rung, self.leader.views())

    def member_api(self, monotonic: Callable[[], float]) -> MemberApi:
        return MemberApi(True, self.join, request_check(self.runtime, monotonic))


def group_peers(runtime: GroupRuntime) -> GroupPeers:
    """The peers a group daemon's owner holds: node 0's lead, the others follow."""
    return LeaderPeers(runtime) if runtime.leader is not None else GroupPeers(runtime)
