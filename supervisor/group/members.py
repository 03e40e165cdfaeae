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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from probes.types import Observation
from supervisor.common.exitcodes import EXIT_GROUP_RESTART
from supervisor.config.settings import Settings
from supervisor.group.client import Answer, GroupClient
from supervisor.group.credentials import load_keys
from supervisor.group.fingerprint import fingerprint
from supervisor.group.joining import JoinAnswer, answer_join, formed, lacking
from supervisor.group.judging import judge, nodes_of
from supervisor.group.leader import GroupLeader, Timeouts
from supervisor.group.peers import Asked, Beating, Clearance, Judged, MemberApi, NoPeers, Record
from supervisor.group.report import build_report
from supervisor.group.runtime import GroupRuntime, state_identity
from supervisor.group.signing import NonceBook, RequestCheck
from supervisor.group.verdict import NodeReport
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
    record("group_evidence", level, id=incident_id, bundles=bundles, culprits=culprits, nodes=nodes_of(answers))


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
    record("group_stop", "info" if all(a.ok for a in answers) else "warning", nodes=nodes_of(answers))


async def launch_members(g: GroupRuntime, rung: str, beating: Beating, record: Record) -> None:
    """The members the leader stopped launch the rung it launches: the ladder moves for the group."""
    if g.leader is None or not g.members_stopped:
        return
    g.mark_members_stopped(False)
    answers: tuple[Answer, ...] = await beating(g.leader.launch_all(rung))
    g.missed -= {a.node for a in answers if a.ok}  # launched now: its server is the group's
    record("group_launch", "info" if all(a.ok for a in answers) else "warning", rung=rung, nodes=nodes_of(answers))


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
