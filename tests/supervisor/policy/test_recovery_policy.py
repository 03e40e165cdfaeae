"""The recovery policy of issue 49, as tables and as the sequences an operator met: a failed promote
goes straight back, a rung that served keeps its standing, backoffs never carry over, a known-good
rung survives a daemon restart mid-try. Each sequence drives the pure records the owner calls, in
the owner's order (launch, ready, stable, incident), so the states are the ones the daemon makes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from supervisor.config.settings import RestartSettings, Rung
from supervisor.policy.ladder import (
    Incident,
    LadderState,
    configuration_shaped,
    record_launch,
    record_ready,
    record_stable,
    resume_rung,
)
from supervisor.policy.recovery import AfterStop, Recovery, after_incident

LADDER = (
    Rung(name="base"),
    Rung(name="smaller-graphs", args={"cuda-graph-max-bs": 8}),
    Rung(name="no-cuda-graph", args={"disable-cuda-graph": True}, on=["cuda_graph_capture"]),
    Rung(name="no-spec", drop=["speculative-algorithm"]),
    Rung(name="last", args={"disable-cuda-graph": True}),
)
SPEC = (True, True, True, False, False)
S = RestartSettings(retries_per_rung=1, backoff_initial_s=15, backoff_max_s=300, backoff_jitter=0)
T0 = 1_000_000.0
STALL = Incident("startup_stall", "idle_deadlock")
CAPTURE = Incident("startup_stall", "cuda_graph_capture")
FRONT_STOPPED = Incident("unhealthy", "unknown")
XID = Incident("rank_died", None, gpu_fault=True)


@dataclass
class Run:
    """The ladder as the owner drives it: launch, ready, stable, incident -> decision."""

    state: LadderState = field(default_factory=LadderState)
    t: float = T0
    launches: int = 0

    def launch(self, rung: int, *, after_incident: bool = True) -> Run:
        self.t += 60
        self.launches += 1
        self.state = record_launch(self.state, rung, LADDER[rung].name, self.t, after_incident=after_incident)
        return self

    def ready(self) -> Run:
        self.t += 30
        self.state = record_ready(self.state, self.t)
        return self

    def stable(self) -> Run:
        self.t += S.stable_s
        self.state = record_stable(self.state)
        return self

    def incident(self, incident: Incident, *, manual: bool = False, forced: int | None = None) -> Recovery:
        self.t += 20
        out = after_incident(
            LADDER, self.state, incident, AfterStop(True), S, manual=manual, forced_rung=forced, now_wall=self.t,
            rand=0.5, speculative=SPEC,
        )  # fmt: skip
        assert isinstance(out, Recovery)
        self.state = out.ladder
        return out


def serving_on(rung: int) -> Run:
    """A daemon that came down the ladder to `rung`, which then served stably."""
    run = Run().launch(0, after_incident=False)
    run.state = record_launch(run.state, rung, LADDER[rung].name, run.t, after_incident=True)
    return run.ready().stable()


def test_a_failed_promote_makes_two_launches_and_no_backoff() -> None:
    """The operator's promote from no-cuda-graph while base's cause persists: base once, then
    straight back to no-cuda-graph, the rung that served (before: base, smaller-graphs twice, then
    no-cuda-graph, 5 launches and 167 s of backoff)."""
    run = serving_on(2)
    promote = run.incident(Incident("manual"), manual=True, forced=0)
    assert (promote.decision.rung, promote.decision.backoff_s) == (0, 0.0)
    run.launch(promote.decision.rung)
    assert run.state.trial_from == 2
    back = run.incident(CAPTURE)
    assert (back.decision.action, back.decision.rung, back.decision.backoff_s) == ("relaunch", 2, 0.0)
    assert "back to rung no-cuda-graph" in back.decision.reason and back.ladder.trial_from is None
    run.launch(back.decision.rung)
    assert run.launches - 1 == 2  # the promote's two launches
    assert run.state.attempts[-2].outcome == "startup_stall"  # the try's failure is kept


def test_a_promote_that_serves_stably_becomes_the_rung() -> None:
    run = serving_on(2)
    run.launch(run.incident(Incident("manual"), manual=True, forced=0).decision.rung)
    run.ready().stable()
    assert run.state.trial_from is None and run.state.last_good == 0
    again = run.incident(STALL)  # later a start-up fault of base: base's own retries decide
    assert again.decision.rung == 0


def test_a_second_unrelated_fault_keeps_a_rung_that_served() -> None:
    """The H100 run: base used its retry on a start-up hang, came back and served 163 s, then a
    stopped front end was judged: relaunched on base (before: stepped down to no-cuda-graph)."""
    run = Run().launch(0, after_incident=False)
    first = run.incident(STALL)
    assert first.decision.rung == 0 and first.decision.backoff_s == 15.0  # its one retry
    run.launch(0).ready()
    second = run.incident(FRONT_STOPPED)
    assert (second.decision.rung, second.decision.backoff_s) == (0, 0.0)
    assert "keeps its standing" in second.decision.reason


def test_no_backoff_is_carried_from_earlier_incidents() -> None:
    """Three start-up failures walked the ladder (backoffs 15, 30, 60 s); once the rung served, its
    next incident that the ladder judges waits the initial backoff, not 120 s."""
    run = Run().launch(0, after_incident=False)
    for _ in range(3):  # base, its retry, smaller-graphs
        out = run.incident(STALL)
        run.launch(out.decision.rung)
    assert run.state.consecutive_failures == 3
    run.ready()
    assert run.state.consecutive_failures == 0
    run.incident(FRONT_STOPPED)  # its free relaunch
    run.launch(run.state.current).ready()
    judged = run.incident(FRONT_STOPPED)  # again before stable: the ladder judges it, from afresh
    assert judged.decision.backoff_s == 15.0


def test_a_rung_that_serves_and_fails_again_and_again_still_steps_down() -> None:
    """One free relaunch in a row: a crash loop after ready is judged by the rung's retries."""
    run = serving_on(0)
    rungs = []
    for _ in range(4):
        out = run.incident(Incident("exited"))
        rungs.append(out.decision.rung)
        run.launch(out.decision.rung).ready()
    assert rungs == [0, 0, 1, 1]  # free, retry, step down, then the new rung's free relaunch


@pytest.mark.parametrize(
    "incident,shaped",
    [
        (CAPTURE, True),  # a rung below answers cuda_graph_capture
        (Incident("spec_regression"), True),  # a rung below has no speculation
        (FRONT_STOPPED, False),
        (Incident("exited"), False),
        (Incident("serving_stall", "busy_spin"), False),
        (XID, False),  # a GPU fault is the host's
        (Incident("startup_stall", "cuda_graph_capture", gpu_fault=True), False),
    ],
)
def test_what_the_evidence_says_of_the_configuration(incident: Incident, shaped: bool) -> None:
    state = record_launch(LadderState(), 0, "base", T0, after_incident=False)
    assert configuration_shaped(LADDER, state, incident, SPEC) is shaped


@pytest.mark.parametrize(
    "incident,expect_rung,expect_backoff",
    [
        (FRONT_STOPPED, 0, 0.0),  # served, not the configuration: same rung at once
        (XID, 0, 0.0),
        (CAPTURE, 2, 15.0),  # the configuration's: the ladder jumps to the rung that answers it
        (Incident("spec_regression"), 3, 15.0),
    ],
)
def test_after_a_rung_served(incident: Incident, expect_rung: int, expect_backoff: float) -> None:
    run = Run().launch(0, after_incident=False).ready()
    out = run.incident(incident)
    assert (out.decision.rung, out.decision.backoff_s) == (expect_rung, expect_backoff)


def test_a_gpu_fault_before_ready_spends_no_retry_once() -> None:
    run = Run().launch(0, after_incident=False)
    out = run.incident(XID)
    assert (out.decision.rung, out.decision.backoff_s, out.ladder.failures_on_current) == (0, 0.0, 0)
    run.launch(0)
    again = run.incident(XID)  # a second in a row: the ladder judges it (its retry)
    assert again.ladder.failures_on_current == 1


def test_the_hourly_budget_bounds_every_relaunch() -> None:
    s = RestartSettings(retries_per_rung=1, backoff_initial_s=1, backoff_jitter=0, max_restarts_per_hour=2)
    state = record_launch(LadderState(), 2, "no-cuda-graph", T0, after_incident=False)
    state = record_ready(state, T0 + 1)
    for i, rung in enumerate((0, 2)):  # a promote, then back: two relaunches after incidents
        state = record_launch(state, rung, LADDER[rung].name, T0 + 2 + i, after_incident=True)
    stop = AfterStop(True)
    out = after_incident(LADDER, state, STALL, stop, s, manual=False, forced_rung=None, now_wall=T0 + 10, rand=0.5)
    assert isinstance(out, Recovery) and out.decision.action == "give_up"


@pytest.mark.parametrize("start_from", ["last_good", "preferred"])
def test_a_daemon_restarted_mid_try_starts_on_the_rung_that_served(start_from: str) -> None:
    run = serving_on(2)
    run.launch(run.incident(Incident("manual"), manual=True, forced=0).decision.rung)
    assert run.state.current == 0 and run.state.trial_from == 2
    assert resume_rung(run.state, len(LADDER), start_from) == 2  # type: ignore[arg-type]


def test_a_capture_hang_goes_to_the_first_rung_without_cuda_graphs_even_without_on() -> None:
    """The fault script without `on` triggers: a graph-capture hang on base (which had served) was
    retried on base, then smaller-graphs twice, before no-cuda-graph: 4 launches against the oracle's
    1. A rung that takes CUDA graphs away answers that hang class by its flags."""
    plain = tuple(r.model_copy(update={"on": ()}) for r in LADDER)
    state = record_ready(record_launch(LadderState(), 0, "base", T0, after_incident=False), T0 + 10)
    assert configuration_shaped(plain, state, CAPTURE, SPEC)
    out = after_incident(
        plain, state, CAPTURE, AfterStop(True), S, manual=False, forced_rung=None, now_wall=T0 + 99, rand=0.5,
        speculative=SPEC,
    )  # fmt: skip
    assert isinstance(out, Recovery) and out.decision.rung == 2 and "answers cuda_graph_capture" in out.decision.reason
    vllm = (Rung(name="base"), Rung(name="eager", args={"enforce-eager": True}))
    assert configuration_shaped(vllm, state, CAPTURE)
