"""Issue 51: requests the engine accepted and never started, with /health 200, judged from the engines'
own metrics (queue gauges, the queue-time and time-to-first-token histograms' counts, tokens) for both
engines: a table of wedges and of busy servers that are fine."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from observations import obs

from probes.serving import parse_metrics
from probes.types import HealthObservation, ServingObservation
from supervisor.config.settings import WatchdogSettings
from supervisor.engines import SGLANG, VLLM
from supervisor.policy.admission import Admissions, admissions, moved, never_started
from supervisor.policy.watchdog import assess, new_history

S = WatchdogSettings(poll_interval_s=2, startup_stall_s=60, startup_timeout_s=3600, cpu_only_stall_s=300)
WINDOW = 60.0
POLL = 2.0

# The families each engine really publishes (SGLang 0.5.16's labels; vLLM 0.26.0's).
SGLANG_TEXT = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} RUNNING
sglang:num_running_reqs{model_name="m",tp_rank="1"} RUNNING
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} QUEUED
# TYPE sglang:realtime_tokens counter
sglang:realtime_tokens_total{mode="decode",model_name="m",tp_rank="0"} TOKENS
# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_bucket{le="+Inf",model_name="m",tp_rank="0"} STARTED
sglang:queue_time_seconds_sum{model_name="m",tp_rank="0"} 12.0
sglang:queue_time_seconds_count{model_name="m",tp_rank="0"} STARTED
sglang:queue_time_seconds_count{model_name="m",tp_rank="1"} STARTED
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="m"} 30.0
sglang:time_to_first_token_seconds_count{model_name="m"} FIRSTS
# TYPE sglang:num_requests counter
sglang:num_requests_total{model_name="m"} FINISHED
"""
VLLM_TEXT = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} RUNNING
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} QUEUED
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 40.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} TOKENS
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 3.0
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} STARTED
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} FIRSTS
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} FINISHED
"""

Row = tuple[float, float, float, float, float, float]
Shape = Callable[[int], Row]  # poll i -> running, queued, tokens, started, first tokens, finished


def scrape(engine: str, at: float, shape: Row) -> ServingObservation:
    text, names = (SGLANG_TEXT, SGLANG.metrics) if engine == "sglang" else (VLLM_TEXT, VLLM.metrics)
    for key, value in zip(("RUNNING", "QUEUED", "TOKENS", "STARTED", "FIRSTS", "FINISHED"), shape, strict=True):
        text = text.replace(key, str(value))
    return parse_metrics(text, at, names)


def health(at: float) -> HealthObservation:
    return HealthObservation(at=at, ok=True, status_code=200, latency_s=1.0, error="")


# (case, per poll i: running, queued, tokens, started, first tokens, finished; the poll of the verdict or None)
CASES: list[tuple[str, Shape, int | None, str]] = [
    # SGLang #40809: the loop admits nothing more; requests queue (the gauge grows), none runs.
    ("40809_queued_never_started", lambda i: (0.0, 3.0 + i, 5000.0, 200.0, 200.0, 190.0), 30, "wait and none runs"),
    # SGLang #28815: the batch froze in its verify step; what came later waits behind it.
    ("28815_running_batch_frozen", lambda i: (2.0, 1.0, 5000.0, 200.0, 200.0, 190.0), 30, "none started since"),
    # A decode that never ends while new requests are still prefilled (first tokens, admissions) and
    # none finishes: starting requests is not serving them.
    ("decode_frozen_prefills_go_on", lambda i: (2.0 + i, 1.0, 5000.0, 200.0 + i, 200.0 + i, 190.0), 30, "running"),
    # Heavy load: the queue grows, but tokens move: serving, slowly.
    ("heavy_load_queue_grows_tokens_move", lambda i: (64.0, 10 + 5 * i, 5000.0 + 40 * i, 200, 200, 190), None, ""),
    # Heavy load with a full batch: the queue stands while requests start and end and tokens move.
    ("heavy_load_queue_stands", lambda i: (64, 80, 5000 + 40 * i, 200 + 2 * i, 200 + 2 * i, 190 + 2 * i), None, ""),
    # One-token requests (a scoring load): every request ends in its prefill, so no decode token moves,
    # yet requests finish all the time.
    ("one_token_requests_only_prefill", lambda i: (4.0, 20.0, 5000.0, 200 + 8 * i, 200 + 8 * i, 190 + 8 * i), None, ""),
    # Admissions stop while a long batch decodes: tokens move, so no verdict either.
    ("admissions_pause_behind_long_decodes", lambda i: (64.0, 5.0, 5000.0 + 40 * i, 200.0, 200.0, 190.0), None, ""),
    # An idle server's frozen counters are no wedge.
    ("idle", lambda i: (0.0, 0.0, 5000.0, 200.0, 200.0, 190.0), None, ""),
]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize(("case", "shape", "at", "words"), CASES, ids=[c[0] for c in CASES])
def test_wedges_with_health_200_are_serving_stalls_and_busy_servers_are_not(
    engine: str, case: str, shape: Shape, at: int | None, words: str
) -> None:
    s = S.model_copy(update={"serving_stall_s": WINDOW})
    h = new_history(0.0)
    v = None
    for i in range(1, 80):
        t = POLL * i
        o = obs(t, health=health(t), serving=scrape(engine, t, shape(i)))
        v, h = assess(h, o, t, s, mode="serving")
        if v.is_incident:
            break
    assert v is not None
    if at is None:
        assert v.status == "ready", (engine, case, v)
        return
    # The counters last moved at the first scrape (a first reading): the window later, at the next poll.
    assert v.cause == "serving_stall" and i == at + 1, (engine, case, i, v)
    assert words in v.reason, v.reason
    figures = dict(v.figures)
    assert figures["started_total"] == shape(i)[3] and figures["first_tokens_total"] == shape(i)[4]
    assert figures["since_tokens_s"] >= WINDOW


def test_a_wedge_after_serving_is_judged_a_window_after_the_last_admission() -> None:
    """Traffic flows, then SGLang #40809 begins at 100 s: the verdict is the window after the last
    scrape that moved, not after the first request queued."""
    s = S.model_copy(update={"serving_stall_s": WINDOW})
    h = new_history(0.0)
    onset = 100.0
    for i in range(1, 200):
        t = POLL * i
        n = min(t, onset)
        running, queued = (4.0, 2.0) if t <= onset else (0.0, 3.0)
        shape = (running, queued, 5000.0 + 40 * n, 10 * n, 10 * n, 10 * n)
        v, h = assess(h, obs(t, health=health(t), serving=scrape("sglang", t, shape)), t, s, mode="serving")
        if v.is_incident:
            break
    assert v.cause == "serving_stall"
    assert onset + WINDOW <= t <= onset + WINDOW + POLL, t


def test_finished_requests_move_and_admissions_alone_do_not() -> None:
    assert moved(Admissions(), Admissions(3.0, 3.0, 1.0))  # a first reading
    assert not moved(Admissions(3.0, 3.0, 1.0), Admissions(3.0, 3.0, 1.0))
    assert moved(Admissions(3.0, 3.0, 1.0), Admissions(3.0, 3.0, 2.0))
    assert not moved(Admissions(3.0, 3.0, 1.0), Admissions(5.0, 5.0, 1.0))  # started, none finished
    assert not moved(Admissions(3.0, None), Admissions(3.0, None))  # a family the engine lacks never moves
    assert admissions(None) is None
    assert admissions(ServingObservation(at=0.0, available=False)) is None


def test_the_reason_names_the_wedge() -> None:
    sv = ServingObservation(at=0.0, available=True, running_reqs=0.0, queue_reqs=1.0)
    assert never_started(sv, Admissions(7.0, 7.0)) == (
        "; 1 accepted request waits and none runs; none started since (the queue-time count stays 7)"
    )
    held_open = ServingObservation(at=0.0, available=True, running_reqs=0.0, queue_reqs=0.0, active_requests=2.0)
    assert never_started(held_open, Admissions(7.0, None)) == "; none started since (the queue-time count stays 7)"
    assert never_started(held_open, Admissions()) == ""
