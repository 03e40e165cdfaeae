"""grouping.judge: what the owner acts on, on a worker and on the leader, and what it records."""

from __future__ import annotations

from typing import Any

from supervisor.config.settings import GroupSettings
from supervisor.daemon.grouping import judge, report
from supervisor.group.credentials import GroupKeys
from supervisor.group.runtime import GroupRuntime
from supervisor.policy.group import MemberView, NodeReport
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
