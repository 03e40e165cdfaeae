"""Table tests of the decisions around the ladder: after an incident, a refused launch, a serving
poll, a daemon's start (supervisor.policy.recovery), with the facts the owner gathers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from supervisor.config.settings import RestartSettings, Rung
from supervisor.policy.gpufit import refusals_to_cap
from supervisor.policy.ladder import Incident, LadderState, record_launch
from supervisor.policy.recovery import (
    GROUP_SAME_RUNG,
    AfterStop,
    Failed,
    Launch,
    Recovery,
    Resume,
    ServingStep,
    StayStopped,
    Wait,
    after_incident,
    at_start,
    exits_for_group,
    gpu_refused,
    port_refused,
    serving_step,
)

LADDER = (Rung(name="base"), Rung(name="no-graph", args={"disable-cuda-graph": True}))
S = RestartSettings(retries_per_rung=0, backoff_initial_s=5, backoff_max_s=60, backoff_jitter=0)
FAIL = RestartSettings(retries_per_rung=0, backoff_initial_s=5, backoff_jitter=0, release_policy="fail")
NOW = 1_000_000.0
ON_BASE = record_launch(LadderState(), 0, "base", NOW - 100, after_incident=False)
ON_LOWER = record_launch(LadderState(), 1, "no-graph", NOW - 100, after_incident=False)
STALL = Incident("startup_stall", "idle_deadlock")
BLOCKED = "GPU 0 needs a reset: Xid 79"
RELEASE = "the old server did not release its port or GPU memory (release_policy=fail)"


@pytest.mark.parametrize(
    "stop,s,manual,forced,expected",
    [
        # A GPU that needs a reset fails at once, whatever was asked, and before the release check.
        (AfterStop(released=True, xid_blocked=BLOCKED), S, False, None, Failed(BLOCKED)),
        (AfterStop(released=False, xid_blocked=BLOCKED), FAIL, True, 0, Failed(BLOCKED)),
        # A server that kept its port or GPU memory: failed only under release_policy = "fail".
        (AfterStop(released=False), FAIL, False, None, Failed(RELEASE)),
        (AfterStop(released=False), FAIL, True, None, Failed(RELEASE)),
        (AfterStop(released=False), S, False, None, ("relaunch", 1, 5.0)),
        # A manual restart relaunches the rung asked for (else the current one) at once.
        (AfterStop(released=True), S, True, None, ("relaunch", 0, 0.0)),
        (AfterStop(released=True), S, True, 1, ("relaunch", 1, 0.0)),
        # A rung the group forces (a node was away): at once too.
        (AfterStop(released=True), S, False, 0, ("relaunch", 0, 0.0)),
        # Otherwise the ladder decides: no retries here, so one step down after a backoff.
        (AfterStop(released=True), S, False, None, ("relaunch", 1, 5.0)),
    ],
)
def test_after_an_incident(
    stop: AfterStop, s: RestartSettings, manual: bool, forced: int | None, expected: object
) -> None:
    out = after_incident(LADDER, ON_BASE, STALL, stop, s, manual=manual, forced_rung=forced, now_wall=NOW, rand=0.5)
    if isinstance(expected, Failed):
        assert out == expected
        return
    assert isinstance(out, Recovery)
    assert (out.decision.action, out.decision.rung, out.decision.backoff_s) == expected


def test_the_incident_spends_a_retry_only_when_the_ladder_judges_it() -> None:
    stop = AfterStop(released=True)
    manual = after_incident(LADDER, ON_BASE, STALL, stop, S, manual=True, forced_rung=None, now_wall=NOW, rand=0.5)
    group = after_incident(LADDER, ON_BASE, STALL, stop, S, manual=False, forced_rung=0, now_wall=NOW, rand=0.5)
    judged = after_incident(LADDER, ON_BASE, STALL, stop, S, manual=False, forced_rung=None, now_wall=NOW, rand=0.5)
    assert isinstance(manual, Recovery) and isinstance(group, Recovery) and isinstance(judged, Recovery)
    assert manual.ladder.failures_on_current == 0 and manual.ladder.attempts[-1].outcome == "manual"
    # A node that was away is not the rung's fault: the attempt says why it ended, no retry is spent.
    assert group.ladder.failures_on_current == 0 and group.ladder.attempts[-1].outcome == "startup_stall"
    assert judged.ladder.failures_on_current == 1 and judged.ladder.attempts[-1].outcome == "startup_stall"
    assert manual.decision.reason == "manual restart"
    assert group.decision.reason == f"{GROUP_SAME_RUNG}: a node was away, not the servers' fault"


def test_a_rung_the_group_forces_says_which_node_and_why() -> None:
    """Issue 54: a partition was booked as "a node was away"; the decision names what the group saw."""
    cut = replace(STALL, group_why="node 1 was partitioned (150 s waited)")
    out = after_incident(LADDER, ON_BASE, cut, AfterStop(True), S, manual=False, forced_rung=0, now_wall=NOW, rand=0.5)
    assert isinstance(out, Recovery) and out.ladder.failures_on_current == 0
    assert out.decision.reason == (
        "the group relaunches on its rung: node 1 was partitioned (150 s waited), not the servers' fault"
    )


def test_past_the_last_rung_the_ladder_gives_up() -> None:
    out = after_incident(
        LADDER, ON_LOWER, STALL, AfterStop(True), S, manual=False, forced_rung=None, now_wall=NOW, rand=0.5
    )
    assert isinstance(out, Recovery) and out.decision.action == "give_up"


@pytest.mark.parametrize(
    "is_leader,mode,exits",
    [(True, "lws", True), (True, "daemon", False), (False, "lws", False), (False, "daemon", False)],
)
def test_only_a_leader_in_lws_mode_exits_for_the_group(is_leader: bool, mode: str, exits: bool) -> None:
    assert exits_for_group(is_leader, mode) is exits  # type: ignore[arg-type]


def test_a_refused_launch_waits_on_the_backoff_and_a_strict_gpu_refusal_fails() -> None:
    assert port_refused(1, S, 0.5).delay_s == 5.0 and not port_refused(1, S, 0.5).fail
    assert port_refused(3, S, 0.5).delay_s == 20.0
    assert gpu_refused(1, S, 0.5, strict=True).fail
    cap = refusals_to_cap(S.backoff_initial_s, S.backoff_max_s)
    told = [n for n in range(1, cap + 3) if gpu_refused(n, S, 0.5, strict=False).tell_blocked]
    assert told == [cap]  # launch_blocked is said once, when the backoff reaches its cap


PROMOTE = RestartSettings(stable_s=600, promote_after_s=1200)


@pytest.mark.parametrize(
    "s,up,stable_marked,rung,ready,expected",
    [
        (PROMOTE, None, False, 1, True, ServingStep()),  # not ready yet: nothing
        (PROMOTE, 599.0, False, 1, True, ServingStep()),
        (PROMOTE, 600.0, False, 0, True, ServingStep(stable=True)),
        (PROMOTE, 700.0, True, 0, True, ServingStep()),  # stable once per launch
        (PROMOTE, 1200.0, True, 1, True, ServingStep(promote=True)),
        (PROMOTE, 1200.0, False, 1, True, ServingStep(stable=True, promote=True)),
        (PROMOTE, 1200.0, True, 1, False, ServingStep()),  # degraded: not promoted
        (PROMOTE, 5000.0, True, 0, True, ServingStep()),  # on the preferred rung already
        (RestartSettings(stable_s=600), 5000.0, True, 1, True, ServingStep()),  # promote_after_s = 0: never
    ],
)
def test_the_serving_step(
    s: RestartSettings, up: float | None, stable_marked: bool, rung: int, ready: bool, expected: ServingStep
) -> None:
    ready_at = None if up is None else NOW - up
    assert serving_step(s, now=NOW, ready_at=ready_at, stable_marked=stable_marked, rung=rung, ready=ready) == expected


@pytest.mark.parametrize(
    "autostart,stopped,decided,expected",
    [
        (False, True, (1, NOW + 10), Wait()),
        (True, True, (1, NOW + 10), StayStopped()),
        (True, False, (1, NOW + 10), Resume(1, 10.0)),
        (True, False, (1, NOW - 10), Resume(1, 0.0)),  # its backoff is over: at once
        (True, False, (1, NOW + 3600), Resume(1, 60.0)),  # at most backoff_max_s
        (True, False, (None, NOW + 10), Launch(1)),  # a decided rung no longer in the ladder: resume it
        (True, False, None, Launch(1)),  # start_from = last_good
    ],
)
def test_what_a_daemon_does_first(
    autostart: bool, stopped: bool, decided: tuple[int | None, float] | None, expected: object
) -> None:
    state = LadderState(current=0, last_good=1)
    out = at_start(
        state,
        len(LADDER),
        S,
        autostart=autostart,
        stopped_by_request=stopped,
        decided_rung=decided[0] if decided else None,
        decided_launch_at=decided[1] if decided else None,
        now_wall=NOW,
    )
    assert out == expected


def test_a_rung_the_group_forces_passes_the_hourly_budget_like_any_relaunch() -> None:
    """Issue 54: a group that forced its rung skipped the only budget check and looped for ever."""
    s = RestartSettings(retries_per_rung=0, max_restarts_per_hour=3, backoff_jitter=0)
    state = ON_BASE
    for i in range(3):
        state = record_launch(state, 0, "base", NOW + i, after_incident=True)
    stop = AfterStop(True)
    out = after_incident(LADDER, state, STALL, stop, s, manual=False, forced_rung=0, now_wall=NOW + 5, rand=0.5)
    assert isinstance(out, Recovery) and out.decision.action == "give_up"
    assert out.decision.reason == "restart budget spent: 3 restarts in the last hour"
    within = after_incident(LADDER, ON_BASE, STALL, stop, s, manual=False, forced_rung=0, now_wall=NOW, rand=0.5)
    assert isinstance(within, Recovery) and within.decision.action == "relaunch"
