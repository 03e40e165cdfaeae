"""Table tests of the pure ladder: retries, step-down, `on` jumps, budget, backoff, resume."""

from __future__ import annotations

import pytest

from supervisor.config.settings import RestartSettings, Rung
from supervisor.policy.ladder import (
    Incident,
    LadderState,
    backoff,
    fresh_start,
    next_rung,
    record_incident,
    record_launch,
    record_ready,
    record_stable,
    resume_rung,
)

LADDER = (
    Rung(name="base"),
    Rung(name="smaller-graphs", args={"cuda-graph-max-bs": 32}),
    Rung(name="no-cuda-graph", args={"disable-cuda-graph": True}, on=("cuda_graph_capture",)),
    Rung(name="no-spec", drop=("speculative-algorithm",), on=("spec_regression",)),
)
S = RestartSettings(
    retries_per_rung=1, backoff_initial_s=5, backoff_max_s=60, backoff_jitter=0, max_restarts_per_hour=5
)
NOW = 1_000_000.0


@pytest.mark.parametrize(
    "state,incident,action,rung",
    [
        (LadderState(current=0, failures_on_current=0), Incident("startup_stall", "idle_deadlock"), "relaunch", 0),
        (LadderState(current=0, failures_on_current=1), Incident("startup_stall", "idle_deadlock"), "relaunch", 1),
        (LadderState(current=0, failures_on_current=0), Incident("startup_stall", "cuda_graph_capture"), "relaunch", 2),
        (LadderState(current=1, failures_on_current=0), Incident("startup_stall", "cuda_graph_capture"), "relaunch", 2),
        (LadderState(current=2, failures_on_current=1), Incident("exited"), "relaunch", 3),
        (LadderState(current=3, failures_on_current=1), Incident("exited"), "give_up", 3),
        # a matching rung above the current one is not climbed back to
        (LadderState(current=3, failures_on_current=0), Incident("startup_stall", "cuda_graph_capture"), "relaunch", 3),
    ],
)
def test_next_rung_table(state: LadderState, incident: Incident, action: str, rung: int) -> None:
    # As the daemon calls it: the incident is recorded first, then the ladder decides.
    d = next_rung(LADDER, record_incident(state, incident, NOW), incident, S, now_wall=NOW)
    assert (d.action, d.rung) == (action, rung), d.reason


def test_retries_per_rung_counts_relaunches_of_the_same_rung() -> None:
    one = (Rung(name="base"),)
    for retries in (0, 1, 3):
        s = S.model_copy(update={"retries_per_rung": retries})
        st = record_launch(LadderState(), 0, "base", NOW, after_incident=False)
        relaunches = 0
        while True:
            st = record_incident(st, Incident("exited"), NOW)
            d = next_rung(one, st, Incident("exited"), s, now_wall=NOW)
            if d.action == "give_up":
                break
            relaunches += 1
            st = record_launch(st, d.rung, "base", NOW, after_incident=True)
        assert relaunches == retries


def test_first_backoff_is_the_initial_one_and_a_huge_count_is_capped() -> None:
    st = record_incident(LadderState(), Incident("exited"), NOW)
    assert next_rung(LADDER, st, Incident("exited"), S, now_wall=NOW).backoff_s == 5
    assert backoff(1100, S, 0.5) == 60
    assert backoff(10**9, S, 0.5) == 60


def test_fresh_start_clears_counters_keeps_memory() -> None:
    st = LadderState(current=2, failures_on_current=3, consecutive_failures=9, last_good=1, restart_times=(NOW,))
    f = fresh_start(st)
    assert (f.failures_on_current, f.consecutive_failures, f.restart_times) == (0, 0, ())
    assert (f.current, f.last_good) == (2, 1)


def test_budget_gives_up() -> None:
    st = LadderState(restart_times=tuple(NOW - 60 * i for i in range(5)))
    d = next_rung(LADDER, st, Incident("exited"), S, now_wall=NOW)
    assert d.action == "give_up" and "budget" in d.reason
    old = LadderState(restart_times=tuple(NOW - 3700 - i for i in range(5)))
    assert next_rung(LADDER, old, Incident("exited"), S, now_wall=NOW).action == "relaunch"


def test_spec_regression_goes_to_first_rung_without_speculation() -> None:
    d = next_rung(
        LADDER, LadderState(), Incident("spec_regression"), S, now_wall=NOW, speculative=(True, True, True, False)
    )
    assert d.rung == 3
    d = next_rung(LADDER, LadderState(), Incident("spec_regression"), S, now_wall=NOW, speculative=(True,) * 4)
    assert d.action == "give_up"


def test_backoff_grows_caps_and_jitters() -> None:
    assert [backoff(n, S, 0.5) for n in range(0, 6)] == [0, 5, 10, 20, 40, 60]
    j = S.model_copy(update={"backoff_jitter": 0.2})
    assert backoff(2, j, 0.0) == pytest.approx(8.0)
    assert backoff(2, j, 0.999) == pytest.approx(12.0, rel=1e-3)


def test_delays_grow_through_records() -> None:
    st = record_launch(LadderState(), 0, "base", NOW, after_incident=False)
    delays = []
    for i in range(4):
        st = record_incident(st, Incident("exited"), NOW + i)
        d = next_rung(LADDER, st, Incident("exited"), S.model_copy(update={"retries_per_rung": 10}), now_wall=NOW + i)
        delays.append(d.backoff_s)
        st = record_launch(st, d.rung, LADDER[d.rung].name, NOW + i, after_incident=True)
    assert delays == sorted(delays) and delays[0] < delays[-1]
    assert st.attempts[0].outcome == "exited"
    assert st.restarts_within_hour(NOW + 5) == 4


def test_records_ready_and_stable() -> None:
    st = record_launch(LadderState(), 1, "smaller-graphs", NOW, after_incident=True)
    st = record_incident(st, Incident("exited"), NOW)
    st = record_ready(record_launch(st, 1, "smaller-graphs", NOW, after_incident=True), NOW + 5)
    # Ready gives back the retries spent before it and starts the backoff afresh (issue 49): a rung
    # that served keeps its standing, and the next, unrelated incident waits no leftover backoff.
    assert st.last_good == 1 and st.failures_on_current == 0 and st.consecutive_failures == 0
    assert st.attempts[-1].outcome == "ready" and st.attempts[-1].ready_at == NOW + 5 and st.served
    st = record_stable(st)
    assert st.failures_on_current == 0 and st.consecutive_failures == 0


@pytest.mark.parametrize(
    "current,last_good,start_from,expect",
    [
        (0, 0, "last_good", 0),  # served on the preferred rung: resume there
        (1, 1, "last_good", 1),
        (1, None, "last_good", 1),  # killed mid-ladder: don't repeat the rung that failed
        (0, 1, "last_good", 1),  # a promotion experiment was under way: back to what served
        (1, 0, "last_good", 1),  # rung 0 served once, then failed: stay down
        (2, 1, "preferred", 0),
    ],
)
def test_resume(current: int, last_good: int | None, start_from: str, expect: int) -> None:
    st = LadderState(current=current, last_good=last_good)
    assert resume_rung(st, len(LADDER), start_from) == expect  # type: ignore[arg-type]
