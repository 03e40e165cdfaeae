"""grouping.judge: what the owner acts on, on a worker and on the leader, and what it records."""

from __future__ import annotations

from typing import Any

from supervisor.config.settings import GroupSettings
from supervisor.group.credentials import GroupKeys
from supervisor.group.judging import judge
from supervisor.group.members import report
from supervisor.group.runtime import GroupRuntime
from supervisor.group.verdict import MemberView, NodeReport
from supervisor.policy.watchdog import Verdict
from supervisor.status.snapshot import ProcessView, StatusSnapshot

KEYS = GroupKeys(0, b"s" * 16, b"k" * 32)

READY = Verdict("ready", reason="healthy", phase="serving")
DIED = Verdict("incident", "rank_died", "child process(es) [7] exited", phase="serving")


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, level: str = "info", /, **fields: Any) -> None:
        self.events.append((event, fields))


class FakeLeader:
    polls = 0  # poll rounds of the members (GroupLeader.polls)

    def __init__(self, views: tuple[MemberView, ...]) -> None:
        self._views = views

    def views(self) -> tuple[MemberView, ...]:
        return self._views


def leader_with(*views: MemberView) -> GroupRuntime:
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=0, members=("h1:1",)), None, KEYS)
    g.leader = FakeLeader(views)  # type: ignore[assignment]
    return g


def member(state: str = "ready", *, cause: str | None = None, reachable: bool = True, down: float = 0.0) -> MemberView:
    r = NodeReport(1, state, "serving", 5, "base", cause, "why", (), (), 0.1, 1.0)
    return MemberView(1, "h1:1", reachable, r, down, "" if reachable else "refused")


def test_a_worker_holds_its_incident_and_acts_on_nothing() -> None:
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=1, leader="h0:1"), None, KEYS)
    rec = Recorder()
    out = judge(g, DIED, "ready", rec)
    assert out.verdict is None and "held for the group's leader" in out.hold
    assert (g.held_cause, rec.events[0][0]) == ("rank_died", "group_member_incident")
    assert judge(g, READY, "ready", rec).verdict == READY  # no incident: as usual


def test_the_leader_acts_on_a_members_incident() -> None:
    rec = Recorder()
    out = judge(leader_with(member("hung", cause="rank_died")), READY, "ready", rec)
    assert out.verdict is not None and out.verdict.is_incident and out.verdict.cause == "rank_died"
    assert out.verdict.reason == "node 1: why"
    assert [e for e, _ in rec.events] == ["group_incident"]


def test_degraded_is_recorded_once_and_recovery_once() -> None:
    rec = Recorder()
    g = leader_with(member(reachable=False, down=30.0))
    for _ in range(3):
        out = judge(g, READY, "ready", rec)
        assert out.verdict is not None and out.verdict.status == "degraded" and "node 1" in out.verdict.reason
    g.leader = FakeLeader((member(),))  # type: ignore[assignment]
    assert judge(g, READY, "degraded", rec).verdict == READY
    assert [e for e, _ in rec.events] == ["group_degraded", "group_recovered"]


def test_the_report_hides_a_cause_once_the_node_left_hung() -> None:
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=1, leader="h0:1"), None, KEYS)
    g.held_cause, g.held_reason = "rank_died", "x"
    procs = (
        ProcessView(pid=9, role="scheduler", rank=1, title="sglang::scheduler_TP1", status="stopped", rss_bytes=1),
    )
    hung = report(g, StatusSnapshot(state="hung", processes=procs), None, None, 5.0)
    assert hung.cause == "rank_died" and hung.ranks[0].status == "stopped"
    later = report(g, StatusSnapshot(state="starting"), None, None, 6.0)
    assert later.cause is None


def test_degraded_is_journalled_on_change_not_on_every_poll() -> None:
    """Issue 34: the reason counts the seconds a member has been away; the journal does not."""
    rec = Recorder()
    g = leader_with(member(reachable=False, down=30.0))
    for down in (30.0, 31.0, 32.5, 40.0):
        g.leader = FakeLeader((member(reachable=False, down=down),))  # type: ignore[assignment]
        out = judge(g, READY, "ready", rec)
        assert out.verdict is not None and f"{down:.0f} s" in out.verdict.reason
    assert [e for e, _ in rec.events] == ["group_degraded"]


class RelaunchingLeader(FakeLeader):
    def __init__(self, views: tuple[MemberView, ...]) -> None:
        super().__init__(views)
        self.relaunched: list[tuple[int, str]] = []

    async def relaunch_one(self, node: int, rung: str) -> tuple[Any, Any]:
        from supervisor.group.client import Answer

        self.relaunched.append((node, rung))
        return Answer(node, "h1:1", True, 200, {}), Answer(node, "h1:1", True, 202, {})


async def test_a_member_on_another_rung_is_relaunched_on_the_groups_not_a_ladder_step() -> None:
    import asyncio

    rec = Recorder()
    r = NodeReport(1, "ready", "serving", 5, "second", None, "", (), (), 0.1, 1.0)
    leader = RelaunchingLeader((MemberView(1, "h1:1", True, r),))
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=0, members=("h1:1",)), None, KEYS)
    g.leader = leader  # type: ignore[assignment]
    g.own_rung, g.own_state = "base", "ready"
    out = judge(g, READY, "ready", rec)
    assert out.verdict is not None and out.verdict.status == "degraded"  # named, not an incident
    assert "node 1 runs rung 'second', the group rung 'base'" in out.verdict.reason
    judge(g, READY, "ready", rec)  # a second poll while the relaunch runs starts no second one
    await asyncio.gather(*g.tasks)
    assert leader.relaunched == [(1, "base")]
    names = [e for e, _ in rec.events]
    assert names.count("group_mismatch") == 1 and "group_launch" in names and "group_incident" not in names
    launch = dict(rec.events)["group_launch"]
    assert launch["rung"] == "base" and launch["mismatch"] is True


def test_a_member_whose_config_differs_on_the_same_rung_is_named_not_relaunched() -> None:
    rec = Recorder()
    r = NodeReport(1, "ready", "serving", 5, "base", None, "", (), (), 0.1, 1.0, fingerprint={"tp-size": "4"})
    leader = RelaunchingLeader((MemberView(1, "h1:1", True, r),))
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=0, members=("h1:1",)), None, KEYS)
    g.leader = leader  # type: ignore[assignment]
    g.own_rung, g.own_state, g.fingerprint = "base", "ready", {"tp-size": "2"}
    out = judge(g, READY, "ready", rec)
    assert out.verdict is not None and "tp-size (leader 2, this node 4)" in out.verdict.reason
    assert leader.relaunched == [] and not g.tasks


async def test_a_launch_ends_the_verdict_a_worker_held_so_later_bundles_give_their_own_cause() -> None:
    from supervisor.group.members import GroupPeers
    from supervisor.status.commands import Command

    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=1, leader="h0:1"), None, KEYS)
    judge(g, DIED, "ready", Recorder())

    async def beating(work):  # type: ignore[no-untyped-def]
        return await work

    peers = GroupPeers(g)
    peers.attach(lambda *a, **kw: None, beating)
    asked = peers.asked(Command(kind="diagnose", incident_id="A", source="group"))
    assert asked is not None and asked.cause == "rank_died"

    cleared = await peers.clearance("base", True)  # the leader's relaunch of this node
    assert cleared.rung == "base"
    asked = peers.asked(Command(kind="diagnose", incident_id="B", source="group"))
    assert asked is not None and asked.cause is None


class ClockedLeader(RelaunchingLeader):
    def __init__(self, views: tuple[MemberView, ...]) -> None:
        super().__init__(views)
        self.t = 100.0

    def now(self) -> float:
        return self.t


async def test_node_0s_stall_at_the_rendezvous_for_a_member_on_an_old_rung_relaunches_that_member_only() -> None:
    import asyncio

    rec = Recorder()
    r = NodeReport(1, "ready", "serving", 5, "base", None, "", (), (), 0.1, 1.0)  # adopted from the old group
    leader = ClockedLeader((MemberView(1, "h1:1", True, r),))
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=0, members=("h1:1",), absent_wait_s=30.0), None, KEYS)
    g.leader = leader  # type: ignore[assignment]
    g.own_rung, g.own_state = "second", "starting"
    stall = Verdict("incident", "startup_stall", "no channel moved for 5 s", phase="initializing")
    out = judge(g, stall, "starting", rec)
    assert out.verdict is not None and out.verdict.status == "starting", out
    assert "waiting for node 1" in out.verdict.reason and "another rung" in out.verdict.reason
    await asyncio.gather(*g.tasks)
    assert leader.relaunched == [(1, "second")]
    # Relaunched, its first report still to come: node 0 waits on; no incident, no ladder step.
    leader._views = (MemberView(1, "h1:1", True, None),)
    leader.t += 5
    out = judge(g, stall, "starting", rec)
    assert out.verdict is not None and out.verdict.status == "starting"
    names = [e for e, _ in rec.events]
    assert "group_mismatch" in names and "group_incident" not in names
    # Bounded like any wait for a member: past absent_wait_s the stall goes ahead, on the same rung.
    leader.t += 30
    out = judge(g, stall, "starting", rec)
    assert out.verdict is not None and out.verdict.is_incident and out.same_rung


def on_second(state: str, phase: str) -> MemberView:
    return MemberView(1, "h1:1", True, NodeReport(1, state, phase, 5, "second", None, "", (), (), 0.1, 1.0))


async def test_node_0s_stall_after_the_member_was_already_relaunched_still_waits_for_it() -> None:
    """The order a loaded machine gave (CI, 2026-12-06): the member came back on an old rung while
    node 0 was still within its window, was relaunched on the group's rung, and only then did node 0's
    start-up stall come, with the member's first report still to come. Node 0 waits for it."""
    import asyncio

    rec = Recorder()
    r = NodeReport(1, "ready", "serving", 5, "base", None, "", (), (), 0.1, 1.0)
    leader = ClockedLeader((MemberView(1, "h1:1", True, r),))
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=0, members=("h1:1",), absent_wait_s=30.0), None, KEYS)
    g.leader = leader  # type: ignore[assignment]
    g.own_rung, g.own_state = "second", "starting"
    quiet = Verdict("starting", reason="initializing", phase="initializing")
    out = judge(g, quiet, "starting", rec)  # no stall yet: the mismatch is found and fixed meanwhile
    assert out.verdict is not None and out.verdict.status == "starting"
    await asyncio.gather(*g.tasks)
    assert leader.relaunched == [(1, "second")] and not g.fixing
    leader._views = (MemberView(1, "h1:1", True, None),)  # relaunched: its first report is to come
    stall = Verdict("incident", "startup_stall", "no channel moved for 5 s", phase="initializing")
    out = judge(g, stall, "starting", rec)
    assert out.verdict is not None and out.verdict.status == "starting", out
    assert "waiting for node 1" in out.verdict.reason
    # Its server starting on the group's rung: still waited for.
    leader._views = (on_second("starting", "initializing"),)
    leader.t += 3
    out = judge(g, stall, "starting", rec)
    assert out.verdict is not None and out.verdict.status == "starting", out
    # Once it reports ready it explains nothing any more: node 0's own stall is the group's incident.
    leader._views = (on_second("ready", "serving"),)
    judge(g, quiet, "starting", rec)
    assert not g.relaunched
    out = judge(g, stall, "starting", rec)
    assert out.verdict is not None and out.verdict.is_incident


def test_node_0s_failing_health_explained_by_a_member_back_without_its_server_keeps_the_rung() -> None:
    """The order a loaded machine gave (CI, 2026-12-06): node 1's daemon and server were lost, its
    daemon came back (it answers, `stopped`, no incident of its own) and node 0's health failed
    before node 1 asked to join. Node 0's server waits on ranks that are gone: the group is
    relaunched on the same rung, as for the rejoin, not stepped down the ladder."""
    rec = Recorder()
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=0, members=("h1:1",)), None, KEYS)
    g.own_rung, g.own_state = "base", "degraded"
    unhealthy = Verdict("incident", "unhealthy", "2 health checks failed in a row (HTTP 503)", phase="serving")
    for state in ("stopped", "restarting"):
        g.leader = ClockedLeader((member(state),))  # type: ignore[assignment]
        out = judge(g, unhealthy, "degraded", rec)
        assert out.verdict is not None and out.verdict.is_incident and out.same_rung, (state, out)
        assert f"node 1 runs no server (state {state})" in out.verdict.reason
        assert out.same_rung.startswith("node 1 runs no server through no fault of its own"), out.same_rung
    # A member holding an incident of its own, or serving, does not excuse the rung.
    for view in (member("restarting", cause="exited"), member("ready")):
        g.leader = ClockedLeader((view,))  # type: ignore[assignment]
        out = judge(g, unhealthy, "degraded", rec)
        assert out.verdict is not None and out.verdict.is_incident and not out.same_rung, (view, out)


# ---- issue 54: a hang on every node is the rung's; the absent node is waited for at any size ----

KV_STALL = Verdict("incident", "startup_stall", "no channel moved for 30 s", phase="allocating_kv")


def starting_member(node: int, phase: str, *, cause: str | None = None) -> MemberView:
    state = "hung" if cause else "starting"
    r = NodeReport(node, state, phase, 5, "base", cause, "stalled", (), (), 9.0, 1.0)
    return MemberView(node, f"h{node}:1", True, r)


def clocked(*views: MemberView, nnodes: int = 2, wait: float = 60.0) -> tuple[GroupRuntime, ClockedLeader]:
    members = tuple(f"h{i}:1" for i in range(1, nnodes))
    g = GroupRuntime(GroupSettings(nnodes=nnodes, node_rank=0, members=members, absent_wait_s=wait), None, KEYS)
    leader = ClockedLeader(views)
    g.leader = leader  # type: ignore[assignment]
    g.own_rung, g.own_state = "base", "starting"
    return g, leader


def test_a_hang_on_every_node_after_the_load_is_the_rungs_at_once_never_a_node_away() -> None:
    rec = Recorder()
    g, _ = clocked(starting_member(1, "allocating_kv"))
    out = judge(g, KV_STALL, "starting", rec)
    assert out.verdict is not None and out.verdict.is_incident and not out.same_rung, out
    assert "never joined" not in out.verdict.reason and "nodes 0, 1 showed the fault alike" in out.verdict.reason
    names = [e for e, _ in rec.events]
    assert "group_waiting" not in names and dict(rec.events)["group_incident"]["alike"] == [0, 1]


def test_a_members_own_stall_after_the_leader_waited_for_it_is_judged_by_the_ladder() -> None:
    """The order the trials found: node 0 waited for node 1 (behind it), then node 1 held its own
    stall. Its own fault: the ladder's, not the group's forced same-rung relaunch."""
    rec = Recorder()
    g, leader = clocked(starting_member(1, "loading_weights"))
    out = judge(g, KV_STALL, "starting", rec)
    assert out.verdict is not None and out.verdict.status == "starting" and g.waiting_for == 1
    leader._views = (starting_member(1, "loading_weights", cause="startup_stall"),)
    leader.t += 5
    out = judge(g, KV_STALL, "starting", rec)
    assert out.verdict is not None and out.verdict.is_incident and out.verdict.cause == "startup_stall"
    assert not out.same_rung


def test_three_nodes_a_present_members_stall_waits_for_the_absent_node_and_names_it() -> None:
    rec = Recorder()
    away = MemberView(2, "h2:1", False, None, 40.0, "connection refused")
    held = starting_member(1, "initializing", cause="startup_stall")
    g, leader = clocked(held, away, nnodes=3, wait=60.0)
    quiet = Verdict("starting", reason="initializing", phase="initializing")
    for _ in range(3):
        out = judge(g, quiet, "starting", rec)
        assert out.verdict is not None and out.verdict.status == "starting", out
        assert "waiting for node 2" in out.verdict.reason
        leader.t += 10
    waiting = [f for e, f in rec.events if e == "group_waiting"]
    assert len(waiting) == 1 and waiting[0]["node"] == 2
    leader.t += 60  # past absent_wait_s: the incident goes ahead, named, on the same rung
    out = judge(g, quiet, "starting", rec)
    assert out.verdict is not None and out.verdict.is_incident and out.same_rung
    assert dict(rec.events)["group_incident"]["node"] == 2


def test_three_nodes_the_absent_node_came_and_the_held_stall_goes_ahead_on_the_same_rung() -> None:
    """The order a loaded machine gave: node 2 came within the wait and the group formed without
    node 1's daemon (held `hung`); a poll in which node 1 did not answer ended the wait. Node 1's
    stall was the wait for node 2: relaunched on the rung, no retry spent."""
    rec = Recorder()
    away = MemberView(2, "h2:1", False, None, 40.0, "connection refused")
    held = starting_member(1, "initializing", cause="startup_stall")
    g, leader = clocked(held, away, nnodes=3, wait=60.0)
    quiet = Verdict("starting", reason="initializing", phase="initializing")
    assert judge(g, quiet, "starting", rec).verdict.status == "starting"  # type: ignore[union-attr]
    leader._views = (MemberView(1, "h1:1", False, held.report, 2.0, "timed out"), away)
    leader.t += 2
    judge(g, quiet, "starting", rec)  # node 1 did not answer this poll: no incident, the wait ends
    moved_on = starting_member(1, "loading_weights", cause="startup_stall")  # its server went on, held
    leader._views = (moved_on, starting_member(2, "loading_weights"))
    leader.t += 5
    out = judge(g, Verdict("starting", reason="loading", phase="loading_weights"), "starting", rec)
    assert out.verdict is not None and out.verdict.is_incident and out.same_rung, out
    assert "it stalled waiting for node 2, absent" in out.verdict.reason
    assert out.same_rung == "node 1 stalled waiting for node 2, which was absent"


def test_node_0_failing_its_health_while_the_group_waits_is_not_ready() -> None:
    """Issue 54: `/readyz` stayed 200 on node 0 through the absent-node wait while its own health
    failed; the group does not serve while node 0's server does not, whatever it waits for."""
    from supervisor.group.view import group_view

    rec = Recorder()
    away = MemberView(1, "h1:1", False, None, 30.0, "connection refused")
    g, leader = clocked(away, wait=600.0)
    g.own_state = "ready"
    unhealthy = Verdict("incident", "unhealthy", "3 health checks failed in a row (503)", phase="serving")
    out = judge(g, unhealthy, "ready", rec)
    assert out.verdict is not None and out.verdict.status == "degraded" and "waiting for node 1" in out.verdict.reason
    assert group_view(g, StatusSnapshot(state="degraded")).serves is False
    leader._views = (member(),)  # node 1 back and node 0 healthy again: the group serves
    assert judge(g, READY, "degraded", rec).verdict == READY
    assert group_view(g, StatusSnapshot(state="ready")).serves is True


class PollingLeader(ClockedLeader):
    def __init__(self, views: tuple[MemberView, ...]) -> None:
        super().__init__(views)
        self.polls = 0


def test_node_0s_crash_waits_for_fresh_reports_and_names_the_member_that_crashed() -> None:
    """Issue 54: a member's crash-loop was blamed on the healthy node 0 in 15 of 36 incidents, as
    node 0's collectives broke before the member's own watchdog said so."""
    rec = Recorder()
    exited = Verdict("incident", "exited", "server main process exited 1", phase="serving")
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=0, members=("h1:1",)), None, KEYS)
    leader = PollingLeader((member("ready"),))  # node 1's report from before its crash
    g.leader = leader  # type: ignore[assignment]
    out = judge(g, exited, "ready", rec)
    assert out.verdict is not None and out.verdict.status == "degraded" and "every member first" in out.verdict.reason
    leader.polls += 1  # a round that may have been under way: still waiting
    assert not judge(g, exited, "ready", rec).verdict.is_incident  # type: ignore[union-attr]
    leader.polls += 1
    leader._views = (member("hung", cause="exited"),)  # node 1's own watchdog: its server exited
    out = judge(g, exited, "ready", rec)
    assert out.verdict is not None and out.verdict.is_incident and out.verdict.reason.startswith("node 1:")
    assert dict(rec.events)["group_incident"]["node"] == 1


def test_node_0s_own_crash_goes_ahead_once_every_member_reported_after_it() -> None:
    rec = Recorder()
    exited = Verdict("incident", "exited", "server main process exited 1", phase="serving")
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=0, members=("h1:1",)), None, KEYS)
    leader = PollingLeader((member("ready"),))
    g.leader = leader  # type: ignore[assignment]
    assert not judge(g, exited, "ready", rec).verdict.is_incident  # type: ignore[union-attr]
    leader.polls += 2  # node 1 reported twice since, healthy: node 0's own
    out = judge(g, exited, "ready", rec)
    assert out.verdict is not None and out.verdict.is_incident
    assert out.verdict.reason == "node 0: server main process exited 1"
    # bounded in time too: a poller that stopped answering does not hold node 0's incident
    assert not judge(g, exited, "ready", rec).verdict.is_incident  # type: ignore[union-attr]
    leader.t += 60
    assert judge(g, exited, "ready", rec).verdict.is_incident  # type: ignore[union-attr]


# ---- issue 54: a partition is named, healed without a relaunch where it can be, and costs no retry ----


class Partitioned(PollingLeader):
    pass


def test_a_partition_is_named_in_the_wait_and_given_a_moment_once_it_heals() -> None:
    rec = Recorder()
    seen = member("ready")
    g, _ = clocked(seen, wait=60.0)
    leader = Partitioned((seen,))
    g.leader = leader  # type: ignore[assignment]
    g.own_state = "ready"
    judge(g, READY, "ready", rec)  # node 1 answered before: its identity or report is known
    stall = Verdict("incident", "serving_stall", "4 running, no decode tokens for 10 s", phase="serving")
    leader._views = (MemberView(1, "h1:1", False, seen.report, 12.0, "ReadTimeout"),)
    out = judge(g, stall, "ready", rec)
    assert out.verdict is not None and out.verdict.status == "degraded"
    assert "waiting for node 1 (partitioned 12 s: ReadTimeout)" in out.verdict.reason
    assert [f["condition"] for e, f in rec.events if e == "group_waiting"] == ["partition"]
    # Healed within the wait, node 0's server not yet recovered: a few polls before any relaunch.
    leader._views = (seen,)
    leader.t += 10
    out = judge(g, stall, "ready", rec)
    assert out.verdict is not None and out.verdict.status == "degraded" and "answers again" in out.verdict.reason
    leader.polls += 1
    assert not judge(g, stall, "ready", rec).verdict.is_incident  # type: ignore[union-attr]
    # recovered on its own: nothing to relaunch
    assert judge(g, READY, "degraded", rec).verdict == READY
    assert "group_incident" not in [e for e, _ in rec.events]


def test_a_partition_that_healed_and_did_not_recover_relaunches_on_the_rung_spending_no_retry() -> None:
    rec = Recorder()
    seen = member("ready")
    g, _ = clocked(seen, wait=60.0)
    leader = Partitioned((MemberView(1, "h1:1", False, seen.report, 12.0, "ReadTimeout"),))
    g.leader = leader  # type: ignore[assignment]
    stall = Verdict("incident", "serving_stall", "4 running, no decode tokens for 10 s", phase="serving")
    assert judge(g, stall, "ready", rec).verdict.status == "degraded"  # type: ignore[union-attr]
    leader._views = (seen,)
    assert judge(g, stall, "ready", rec).verdict.status == "degraded"  # type: ignore[union-attr]
    leader.polls += 2
    out = judge(g, stall, "ready", rec)
    assert out.verdict is not None and out.verdict.is_incident and out.same_rung, out
    assert out.same_rung.startswith("node 1 was partitioned ("), out.same_rung  # not "a node was away"


async def test_a_member_that_missed_the_groups_stop_is_relaunched_not_blamed_on_node_0() -> None:
    """Partitioned through the group's relaunch: its old server serves on after it heals, and node
    0's new server waits at the rendezvous for it. That member is relaunched on the group's rung."""
    import asyncio

    rec = Recorder()
    stale = member("ready")  # the same rung, a server from before the relaunch
    leader = RelaunchingLeader((stale,))
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=0, members=("h1:1",), absent_wait_s=30.0), None, KEYS)
    g.leader = leader  # type: ignore[assignment]
    leader.now = lambda: 100.0  # type: ignore[attr-defined]
    g.own_rung, g.own_state, g.missed = "base", "starting", {1}
    stall = Verdict("incident", "startup_stall", "no channel moved for 5 s", phase="initializing")
    out = judge(g, stall, "starting", rec)
    assert out.verdict is not None and out.verdict.status == "starting", out
    assert "a server from before the group's relaunch" in out.verdict.reason
    await asyncio.gather(*g.tasks)
    assert leader.relaunched == [(1, "base")] and not g.missed


async def test_a_member_whose_group_stop_did_not_answer_is_missed_until_it_launches_again() -> None:
    from supervisor.group.client import Answer
    from supervisor.group.members import launch_members, stop_members

    class Cut(FakeLeader):
        launched = True

        async def stop_all(self) -> tuple[Answer, ...]:
            return (Answer(1, "h1:1", False, None, error="ReadTimeout"),)

        async def launch_all(self, rung: str) -> tuple[Answer, ...]:
            return (Answer(1, "h1:1", self.launched, 202 if self.launched else None),)

    async def beating(work):  # type: ignore[no-untyped-def]
        return await work

    rec = Recorder()
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=0, members=("h1:1",)), None, KEYS)
    cut = Cut((member(),))
    g.leader = cut  # type: ignore[assignment]
    cut.launched = False  # still cut off at the launch: its old server, if any, is stale
    await stop_members(g, beating, rec)
    await launch_members(g, "base", beating, rec)
    assert g.missed == {1}
    cut.launched = True
    await stop_members(g, beating, rec)
    await launch_members(g, "base", beating, rec)  # launched by the group: its server is the group's
    assert g.missed == set()
    # A member that missed the stop and then asks to join launches on the leader's word: not stale.
    from supervisor.group.members import answer_join_request

    g.missed, g.own_state, g.own_rung = {1}, "starting", "base"
    assert answer_join_request(g, 1, "a" * 32, {}, False, rec).verdict == "launch"
    assert g.missed == set()
