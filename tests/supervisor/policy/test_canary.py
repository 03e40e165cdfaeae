"""The canary's cadence (issue 51): every check while starting, never while requests run, at most once
a serving window while idle, and at every check after one failed."""

from __future__ import annotations

import pytest

from probes.types import ServingObservation
from supervisor.policy.canary import CanaryState, answered, sent, wants_canary

W = 60.0
IDLE = ServingObservation(at=0.0, available=True, running_reqs=0.0, queue_reqs=0.0)
BUSY = ServingObservation(at=0.0, available=True, running_reqs=2.0, queue_reqs=0.0)
QUEUED = ServingObservation(at=0.0, available=True, running_reqs=0.0, queue_reqs=3.0)
UNKNOWN = ServingObservation(at=0.0, available=False, error="HTTP 500")
PASSED_AT_100 = CanaryState(at=100.0, ok=True)
FAILED_AT_100 = CanaryState(at=100.0, ok=False)

CASES = [
    # (case, flag health, serving, gauges, last canary, now, wanted)
    ("generating_health_never", False, True, IDLE, CanaryState(), 500.0, False),
    ("starting_every_check", True, False, None, PASSED_AT_100, 101.0, True),
    ("serving_busy_never", True, True, BUSY, CanaryState(), 500.0, False),
    ("serving_queued_never", True, True, QUEUED, FAILED_AT_100, 101.0, False),
    ("idle_within_the_window", True, True, IDLE, PASSED_AT_100, 100.0 + W - 1.0, False),
    ("idle_a_window_later", True, True, IDLE, PASSED_AT_100, 100.0 + W, True),
    ("idle_after_a_failure_every_check", True, True, IDLE, FAILED_AT_100, 101.0, True),
    ("idle_none_yet", True, True, IDLE, CanaryState(), 101.0, True),
    ("gauges_unknown_within_the_window", True, True, UNKNOWN, PASSED_AT_100, 110.0, False),
    ("no_scrape_yet_a_window_later", True, True, None, PASSED_AT_100, 100.0 + W, True),
]


@pytest.mark.parametrize(("case", "flag", "serving", "sv", "last", "now", "wanted"), CASES, ids=[c[0] for c in CASES])
def test_the_canary_cadence(
    case: str, flag: bool, serving: bool, sv: ServingObservation | None, last: CanaryState, now: float, wanted: bool
) -> None:
    assert wants_canary(flag, serving, sv, last, now, W) is wanted, case


def test_an_idle_server_gets_one_canary_a_window() -> None:
    """Health checks every 2 s for five windows of an idle server: one canary a window (the first at once)."""
    state, sent_at = CanaryState(), []
    for i in range(int(5 * W / 2)):
        now = 2.0 * i
        if wants_canary(True, True, IDLE, state, now, W):
            state = answered(sent(state, now), ok=True)
            sent_at.append(now)
    assert sent_at == [0.0, 60.0, 120.0, 180.0, 240.0]
