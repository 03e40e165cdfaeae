"""The status snapshot shows only HTTP answers that describe the server as it is now."""

from __future__ import annotations

from dataclasses import replace

import pytest
from observations import obs

from probes.types import (
    BusySample,
    BusyThread,
    GpmDevice,
    GpmObservation,
    HealthObservation,
    PyFrame,
    ServingObservation,
)
from supervisor.daemon.publish import Facts, build
from supervisor.policy.gpuwait import BusyState
from supervisor.policy.watchdog import History, new_history


def facts(history: History, health: HealthObservation | None, serving: ServingObservation | None) -> Facts:
    return Facts(
        state="ready",
        reason="",
        since_wall=0.0,
        state_age_s=0.0,
        rung="base",
        rung_index=0,
        last_good=None,
        ladder=("base",),
        engine="sglang",
        ladder_engines=("sglang",),
        pid=100,
        restarts=1,
        restarts_last_hour=1,
        started_wall=0.0,
        time_to_ready_s=None,
        next_attempt_in_s=None,
        last_incident=None,
        incidents=1,
        selfcheck=(),
        diagnosing=False,
        version="test",
        now=200.0,
        history=history,
        observation=obs(200.0, ready=True),
        health=health,
        serving=serving,
        running=True,
    )


def health(at: float, ok: bool) -> HealthObservation:
    code = 200 if ok else 503
    return HealthObservation(at=at, ok=ok, status_code=code, latency_s=1.0, error="" if ok else "HTTP 503")


# Relaunched at t=100, ready at t=150.
RELAUNCHED = replace(new_history(100.0), ready_at=150.0)


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        (health(90.0, False), None),  # the previous server's 503 (before this launch)
        (health(90.0, True), None),  # the previous server's 200 is not this one's either
        (health(140.0, False), None),  # this server's warm-up 503: says nothing once it serves
        (health(140.0, True), True),  # a 200 during start-up is still true
        (health(160.0, False), False),  # a failure while serving is shown
        (health(160.0, True), True),
    ],
)
def test_health_fields_describe_the_current_server(answer: HealthObservation, shown: bool | None) -> None:
    view = build(facts(RELAUNCHED, answer, None)).serving
    assert view.health_ok is shown
    assert view.health_status == (answer.status_code if shown is not None else None)


def test_metrics_scraped_from_the_previous_server_are_not_shown() -> None:
    old = ServingObservation(at=90.0, available=True, running_reqs=4.0, queue_reqs=0.0, gen_throughput=12.0)
    view = build(facts(RELAUNCHED, None, old)).serving
    assert view.running_reqs is None and not view.metrics_available
    new = replace(old, at=160.0)
    view = build(facts(RELAUNCHED, None, new)).serving
    assert view.running_reqs == 4.0 and view.metrics_available


def stalled_history(tokens_moved_at: float) -> History:
    return replace(RELAUNCHED, tokens=500.0, tokens_moved_at=tokens_moved_at)


@pytest.mark.parametrize(
    ("running", "moved_at", "stale", "rate"),
    [
        (16.0, 199.0, False, 237.0),  # a token a second ago: the rate stands
        (16.0, 180.0, True, None),  # 20 s without a token, 16 running: SGLang's gauges are frozen
        (0.0, 180.0, False, 237.0),  # idle: nothing to be stale about (the watchdog resets the clock then)
    ],
)
def test_frozen_gauges_are_marked_and_give_no_token_rate(
    running: float, moved_at: float, stale: bool, rate: float | None
) -> None:
    sv = ServingObservation(at=199.0, available=True, running_reqs=running, queue_reqs=0.0, gen_throughput=237.0)
    view = build(replace(facts(stalled_history(moved_at), None, sv), stale_after_s=10.0)).serving
    assert (view.stale, view.token_rate) == (stale, rate)
    assert view.tokens_moved_s == round(200.0 - moved_at, 3)


def test_a_serving_server_shows_phase_serving_and_no_start_up_progress_age() -> None:
    snap = build(facts(RELAUNCHED, None, None))
    assert snap.phase == "serving" and snap.last_progress_s is None
    starting = build(replace(facts(RELAUNCHED, None, None), state="starting"))
    assert starting.last_progress_s is not None and starting.phase != "serving"


def test_busy_and_gpm_readings_are_shown_while_starting_only() -> None:
    look = BusySample(
        at=190.0,
        pids=(7,),
        threads=(BusyThread(7, 7, "MainThread", (PyFrame("Event.synchronize", "/x/torch/cuda/streams.py", 29),)),),
        duration_s=0.02,
    )
    starting = replace(
        new_history(100.0), busy=BusyState(spin_since=170.0, kinds=("gpu_wait", "none"), waits_in="pid 7 ...")
    )
    o = replace(obs(200.0), gpm=GpmObservation("ok", "", devices=(GpmDevice(0, "GPU-0", 0.0076, 0.0001),)))
    f = replace(facts(starting, None, None), state="starting", observation=o, busy=look)
    snap = build(f)
    assert snap.busy.looks == 2 and snap.busy.kinds == ("gpu_wait", "none") and snap.busy.gpm_spin_s == 30.0
    assert snap.busy.threads == ("pid 7 'MainThread' in Event.synchronize (torch/cuda/streams.py:29)",)
    assert snap.gpu.gpm_status == "ok" and snap.gpu.devices[0].sm_active_ratio == 0.0076
    served = build(replace(f, history=replace(starting, ready_at=180.0)))
    assert served.busy.looks == 0 and served.busy.gpm_spin_s is None
    assert served.gpu.devices[0].sm_active_ratio == 0.0076  # GPM itself is shown in every state
    stale = build(replace(f, busy=replace(look, at=50.0)))  # a look at the previous server
    assert stale.busy.threads == () and stale.busy.look_s is None
