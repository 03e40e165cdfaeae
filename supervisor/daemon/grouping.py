"""The daemon's part in a multi-node group (docs/MULTINODE.md): hooks the owner calls.

A worker (node_rank >= 1) never acts on its own verdict: it holds it (`hung`, waiting for the
leader), reports it, and captures, stops and launches when the leader asks. The leader combines
its own verdict with its members' reports (supervisor.policy.group), and on a group incident asks
every member at once: capture under the same incident id, stop and verify, launch one rung.
Imports flow actions -> grouping -> core; nothing here acts on processes itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import structlog

from supervisor.config.settings import Settings
from supervisor.daemon.commands import Command, CommandResult
from supervisor.daemon.core import Core
from supervisor.daemon.snapshot import StatusSnapshot
from supervisor.group.client import Answer, GroupClient
from supervisor.group.leader import GroupLeader, Timeouts
from supervisor.group.report import build_report
from supervisor.group.runtime import EXIT_GROUP_RESTART, GroupRuntime
from supervisor.policy.group import NodeReport, OwnVerdict, combine, group_serves
from supervisor.policy.lifecycle import SERVING, State
from supervisor.policy.watchdog import Verdict

log = structlog.get_logger("supervisor")
T = TypeVar("T")
_HELD_STATES = frozenset({"hung", "diagnosing"})


def make_runtime(settings: Settings, token: str | None, monotonic: Callable[[], float]) -> GroupRuntime | None:
    g = settings.group
    if g is None:
        return None
    if not g.is_leader:
        return GroupRuntime(g, None)
    d, rs = settings.diagnostics, settings.restart
    timeouts = Timeouts(
        report_s=g.request_timeout_s,
        # a member's capture runs py-spy and gdb on every process; its stop waits out the grace and the release
        capture_s=d.py_spy_timeout_s + d.gdb_timeout_s + 30.0,
        stop_s=rs.stop_grace_s + rs.release_timeout_s + 30.0,
        launch_s=max(g.request_timeout_s, 30.0),
    )
    members = {i + 1: a for i, a in enumerate(g.members)}
    return GroupRuntime(g, GroupLeader(g, GroupClient(members, token), timeouts, monotonic))


def start(sup: Core) -> None:
    """The leader's poller of its members, beside the loop (never on it)."""
    g = sup.group
    if g is None or g.leader is None:
        return
    g.leader.start(lambda: sup.settings.watchdog.poll_interval_s, sup.clock.sleep)
    sup.journal.append(
        "group_started", node=g.node, nnodes=g.settings.nnodes, role="leader", members=list(g.settings.members)
    )


async def close(sup: Core) -> None:
    g = sup.group
    if g is not None and g.leader is not None:
        await g.leader.close()


def watches_tokens(sup: Core) -> bool:
    """A worker node has no HTTP API of its own (SGLang runs a dummy health server there): its
    /metrics says nothing about progress, so it is not scraped; ranks, log and GPUs still are."""
    return sup.group is None or sup.group.is_leader


def report(sup: Core) -> NodeReport:
    g = sup.group
    assert g is not None
    snap = sup.snapshot()
    held = snap.state in _HELD_STATES
    lost: set[int] = set()
    if sup.history is not None and sup.obs is not None:
        alive = {
            p.pid for p in sup.obs.tree.processes if p.role in ("scheduler", "detokenizer") and p.status != "zombie"
        }
        lost = set(sup.history.ranks) - alive
    return build_report(
        g.node,
        snap,
        cause=g.held_cause if held else None,
        reason=g.held_reason if held else "",
        lost_ranks=lost,
        at=sup.clock.wall(),
        incident=g.captured,
    )


def judge(sup: Core, v: Verdict) -> Verdict | None:
    """The verdict the owner acts on. A worker holds an incident and returns None (nothing to do);
    the leader gets the group's verdict (a member's incident, or its own named by the members)."""
    g = sup.group
    if g is None:
        return v
    if not g.is_leader:
        if v.is_incident:
            hold(sup, v)
            return None
        return v
    assert g.leader is not None
    own = OwnVerdict(sup.lifecycle.state.value, v.status, v.cause, v.reason, v.phase)
    gv = combine(own, g.leader.views(), g.settings.unreachable_s)
    before, g.verdict = g.verdict, gv
    if gv.status != before.status or gv.reason != before.reason:
        if gv.status == "degraded":
            sup.journal.append("group_degraded", reason=gv.reason, nodes=list(gv.degraded))
            log.warning("group_degraded", reason=gv.reason, nodes=list(gv.degraded))
        elif gv.status == "ok" and before.status == "degraded":
            sup.journal.append("group_recovered", reason=gv.reason)
    if gv.is_incident:
        if gv.node not in (None, 0) or not v.is_incident:
            sup.journal.append("group_incident", cause=gv.cause, node=gv.node, rank=gv.rank, reason=gv.reason)
        return Verdict(
            "incident", gv.cause, gv.reason, stall_class=v.stall_class, phase=v.phase, moved=v.moved, figures=v.figures
        )
    if gv.status == "degraded" and v.status == "ready":
        return Verdict("degraded", reason=f"group: {gv.reason}", phase=v.phase)
    return v


def hold(sup: Core, v: Verdict) -> None:
    g = sup.group
    assert g is not None
    g.held_cause, g.held_reason = v.cause, v.reason
    log.warning("group_member_incident", cause=v.cause, reason=v.reason, node=g.node)
    sup.journal.append("group_member_incident", cause=v.cause, reason=v.reason, node=g.node)
    sup.move(State.HUNG, f"{v.cause}: {v.reason}; held for the group's leader (node 0), which restarts the group")


def ready(sup: Core) -> bool:
    """`/readyz`: on the leader, the group serves; elsewhere, this node's server serves."""
    st = sup.lifecycle.state
    g = sup.group
    if g is None or g.leader is None:
        return st in SERVING
    return group_serves(st.value, g.leader.views())


def _nodes(answers: tuple[Answer, ...]) -> list[dict[str, object]]:
    return [
        {"node": a.node, "address": a.address, "ok": a.ok, "error": a.error or None, "s": round(a.elapsed_s, 3)}
        for a in answers
    ]


def _log(what: str, answers: tuple[Answer, ...], **fields: object) -> None:
    (log.info if all(a.ok for a in answers) else log.warning)(what, nodes=_nodes(answers), **fields)


async def capture_together(sup: Core, incident_id: str, own: Awaitable[T]) -> T:
    """The leader's own capture and every member's, for one incident id, at the same moment."""
    g = sup.group
    if g is None or g.leader is None:
        return await own
    g.captured = incident_id
    members = asyncio.ensure_future(g.leader.capture_all(incident_id))
    mine = await own
    answers = await sup.beating(members)
    bundles = {a.node: (str(a.body.get("bundle_id")) if a.ok and a.body.get("bundle_id") else None) for a in answers}
    shown = {str(k): v for k, v in bundles.items()}
    sup.journal.append("group_evidence", id=incident_id, bundles=shown, nodes=_nodes(answers))
    _log("group_evidence", answers, id=incident_id)
    return mine


def bundle_doc(sup: Core, incident_id: str) -> Mapping[str, object] | None:
    g = sup.group
    return g.bundle_doc(incident_id) if g is not None else None


def note_capture(sup: Core, incident_id: str) -> None:
    if sup.group is not None:
        sup.group.captured = incident_id


def exit_for_lws(sup: Core) -> bool:
    """`restart = "lws"`: the group's evidence is written; stop, and exit for LWS to recreate the group."""
    g = sup.group
    if g is None or g.leader is None or g.settings.restart != "lws":
        return False
    g.exit_code = EXIT_GROUP_RESTART
    sup.shutdown_requested = True
    sup.journal.append(
        "group_exit", code=EXIT_GROUP_RESTART, reason="restart = lws: LeaderWorkerSet recreates the group"
    )
    log.warning("group_exit", code=EXIT_GROUP_RESTART)
    return True


async def stop_together(sup: Core, own: Awaitable[bool]) -> bool:
    """Stop and verify this node's tree and every member's at once; True when this node's is verified."""
    g = sup.group
    if g is None or g.leader is None:
        return await own
    g.members_stopped = True
    members = asyncio.ensure_future(g.leader.stop_all())
    ok = await own
    answers = await sup.beating(members)
    sup.journal.append("group_stop", nodes=_nodes(answers))
    _log("group_stop", answers)
    return ok


async def launch_members(sup: Core, rung: str) -> None:
    """The members launch the rung the leader launches: the ladder moves for the group."""
    g = sup.group
    if g is None or g.leader is None or not g.members_stopped:
        return
    g.members_stopped = False
    answers = await sup.beating(g.leader.launch_all(rung))
    sup.journal.append("group_launch", rung=rung, nodes=_nodes(answers))
    _log("group_launch", answers, rung=rung)


async def stop_members(sup: Core) -> None:
    g = sup.group
    if g is None or g.leader is None:
        return
    g.members_stopped = True
    answers = await sup.beating(g.leader.stop_all())
    sup.journal.append("group_stop", nodes=_nodes(answers))
    _log("group_stop", answers)


@dataclass(frozen=True)
class GroupEndpoint:
    """What api/group.py sees of the daemon (its `GroupHandle`)."""

    sup: Core
    submit_command: Callable[[Command], Awaitable[CommandResult]]

    def snapshot(self) -> StatusSnapshot:
        return self.sup.snapshot()

    def group_report(self) -> NodeReport:
        return report(self.sup)

    async def submit(self, command: Command) -> CommandResult:
        return await self.submit_command(command)
