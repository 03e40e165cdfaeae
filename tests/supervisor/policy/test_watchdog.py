"""Table tests of the pure watchdog: every channel alone, stalls, serving verdicts, with a fake clock."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from observations import MB, obs, proc

from probes.logs import LogParser
from probes.types import DecodeStats, HealthObservation, LogLine, Observation, Progress, ServingObservation
from supervisor.config.settings import WatchdogSettings
from supervisor.policy.watchdog import History, assess, new_history

FIXTURES = Path(__file__).parents[2] / "probes" / "fixtures"
S = WatchdogSettings(poll_interval_s=2, startup_stall_s=60, startup_timeout_s=3600, cpu_only_stall_s=300)


def run(history: History, observations: list[Observation], mode: str = "starting", **kw: bool):  # type: ignore[no-untyped-def]
    verdict = None
    for o in observations:
        verdict, history = assess(history, o, o.at, S, mode=mode, **kw)  # type: ignore[arg-type]
        if verdict.is_incident:
            break
    assert verdict is not None
    return verdict, history


def still(t0: float, t1: float, step: float = 2.0, **kw: object) -> list[Observation]:
    out = []
    t = t0
    while t <= t1 + 1e-9:
        out.append(obs(t, **kw))  # type: ignore[arg-type]
        t += step
    return out


def test_nothing_moves_is_a_stall_within_window_plus_a_poll() -> None:
    verdict, _ = run(new_history(0.0), still(2.0, 200.0))
    assert verdict.cause == "startup_stall"
    assert verdict.stall_class == "idle"
    assert 60.0 <= verdict.figures[0][1] <= 62.0


def test_background_noise_cpu_below_threshold_does_not_count() -> None:
    # 5 % of a core of heartbeat threads: not progress.
    seq = [obs(2.0 * i, cpu=1.0 + 0.1 * i) for i in range(1, 100)]
    verdict, _ = run(new_history(0.0), seq)
    assert verdict.cause == "startup_stall"


@pytest.mark.parametrize(
    "channel,make",
    [
        ("log", lambda i: {"lines": 10 + i}),
        ("progress", lambda i: {"progress": Progress(i // 20, 80, "shards", "Loading safetensors checkpoint shards")}),
        ("io", lambda i: {"io": i * 4 * MB}),
        ("rss", lambda i: {"rss": 100 * MB + i * 40 * MB}),
        ("gpu_mem", lambda i: {"gpu_mem": i * 300 * MB}),
        ("port", lambda i: {"ports": tuple(range(40000, 40000 + i // 20))}),
    ],
)
def test_each_channel_alone_keeps_a_long_start_alive(channel: str, make) -> None:  # type: ignore[no-untyped-def]
    # 20 minutes of polls, far beyond the 60 s window, with only this channel moving.
    seq = [obs(2.0 * i, **make(i)) for i in range(1, 600)]
    verdict, hist = run(new_history(0.0), seq)
    assert verdict.status == "starting", verdict
    assert channel in hist.moved_at


def test_stall_is_timed_from_the_last_line_not_from_the_poll_that_read_it() -> None:
    # The last line was read at 1.8 s, seen by the poll at 3.9 s: the stall is due at 61.8 s.
    seq = [obs(3.9 + 2.0 * k, lines=11, line_at=1.8, rss=0) for k in range(40)]
    h = new_history(0.0)
    for o in seq:
        v, h = assess(h, o, o.at, S, mode="starting")
        if v.is_incident:
            break
    assert v.cause == "startup_stall" and o.at == pytest.approx(61.9)


def test_phase_change_alone_is_progress() -> None:
    phases = ["initializing", "loading_weights", "loading_draft", "allocating_kv", "capturing_graphs"]
    seq = [obs(50.0 * i + 2, phase=phases[i]) for i in range(5)]
    verdict, _ = run(new_history(0.0), seq)
    assert verdict.status == "starting"


def test_cpu_alone_postpones_but_a_spin_is_caught_at_cpu_only_window() -> None:
    seq = [obs(2.0 * i, cpu=2.0 * i * 1.0, phase="allocating_kv") for i in range(1, 400)]
    verdict, _ = run(new_history(0.0), seq)
    assert verdict.cause == "startup_stall"
    assert verdict.stall_class == "busy"
    assert 300 <= verdict.figures[0][1] <= 302


def test_busy_gpu_classifies_busy_even_with_idle_cpu() -> None:
    verdict, _ = run(new_history(0.0), still(2.0, 200.0, gpu_util=100.0, gpu_mem=50 * 1024 * MB))
    assert verdict.cause == "startup_stall" and verdict.stall_class == "busy"


def test_progress_bar_regress_is_not_progress_but_new_bar_is() -> None:
    bar = "Loading safetensors checkpoint shards"
    seq = [obs(2, progress=Progress(5, 8, "shards", bar))]
    seq += [obs(2 + 2 * i, progress=Progress(5, 8, "shards", bar)) for i in range(1, 40)]
    verdict, _ = run(new_history(0.0), seq)
    assert verdict.cause == "startup_stall"
    cap = Progress(1, 23, "batches", "Capturing batches")
    verdict, h = run(new_history(0.0), [obs(2, progress=Progress(8, 8, "shards", bar)), obs(50, progress=cap)])
    assert "progress" in h.moved_at and h.moved_at["progress"] == 50


def test_timeout_is_a_backstop_even_while_moving() -> None:
    s = S.model_copy(update={"startup_timeout_s": 100.0})
    h = new_history(0.0)
    for i in range(1, 60):
        v, h = assess(h, obs(2.0 * i, lines=10 + i), 2.0 * i, s, mode="starting")
        if v.is_incident:
            break
    assert v.cause == "startup_timeout"


def test_exit_while_starting_and_serving() -> None:
    v, _ = run(new_history(0.0), [obs(2, alive=False, exit_code=-9)])
    assert v.cause == "exited" and "signal 9" in v.reason
    v, _ = run(new_history(0.0), [obs(2, alive=False, exit_code=1)], mode="serving")
    assert v.cause == "exited"


def test_exit_names_the_error_that_brought_the_tree_down() -> None:
    """Real SGLang 0.5.16, tp 2, on the H200 (server_args line left out): rank 1 refused to start
    beside another server's memory, and SGLang SIGKILLed its own tree. The verdict names the
    RuntimeError, not the SIGQUIT chatter that follows it."""
    raw = (FIXTURES / "real_0.5.16_tp2_unbalanced_memory_crash.log").read_text(encoding="utf-8")
    parser = LogParser()
    parser.feed([LogLine(seq=i, at=i * 0.1, stream="stderr", text=t) for i, t in enumerate(raw.splitlines(), 1)])
    crashed = replace(obs(2, alive=False, exit_code=-9), logs=parser.observe())
    v, _ = run(new_history(0.0), [crashed])
    assert v.cause == "exited" and v.reason.startswith("server main process killed by signal 9; ")
    assert "TP1: RuntimeError: The memory capacity is unbalanced" in v.reason
    assert "sigquit" not in v.reason.lower()


_OK = HealthObservation(at=2, ok=True, status_code=200, latency_s=1.0, error="")
_BAD = HealthObservation(at=2, ok=False, status_code=503, latency_s=1.0, error="HTTP 503")


@pytest.mark.parametrize(
    ("line", "accepts", "owned", "health", "status"),
    [
        (True, False, False, None, "starting"),  # a forged line: nothing bound, nothing answered
        (True, True, False, _OK, "starting"),  # an orphan of another launch holds the port and answers
        (True, True, True, None, "starting"),  # bound, no health answer yet (SGLang's warm-up)
        (True, True, True, _BAD, "starting"),
        (False, True, True, _OK, "ready"),  # builds whose ready line differs
        (True, True, None, _OK, "ready"),  # the tree's descriptors unreadable (another user): port and health
        (True, False, None, _OK, "starting"),
        (True, True, True, _OK, "ready"),
    ],
)
def test_ready_needs_the_port_bound_by_the_tree_and_a_health_answer(
    line: bool, accepts: bool, owned: bool | None, health: HealthObservation | None, status: str
) -> None:
    v, h = run(
        new_history(0.0),
        [obs(2, ready=line, phase="serving" if line else "warming_up", accepts=accepts, owned=owned, health=health)],
    )
    assert v.status == status
    assert (h.ready_at == 2) == (status == "ready")


def test_a_ready_line_without_a_bound_port_ends_as_a_startup_stall() -> None:
    # The child prints the line and then nothing moves: the stall rules judge it, not health checks later.
    v, _ = run(new_history(0.0), still(2, 80, ready=True, phase="serving", accepts=False))
    assert v.cause == "startup_stall" and "phase serving" in v.reason


# ---- serving -------------------------------------------------------------------------------


def health(at: float, ok: bool, latency: float = 1.0) -> HealthObservation:
    return HealthObservation(
        at=at, ok=ok, status_code=200 if ok else 503, latency_s=latency, error="" if ok else "HTTP 503"
    )


def sv(at: float, running: float, tokens: float, accept: float | None = None) -> ServingObservation:
    return ServingObservation(
        at=at, available=True, running_reqs=running, queue_reqs=0, decode_tokens_total=tokens, spec_accept_length=accept
    )


def test_health_failures_degrade_then_unhealthy() -> None:
    h = new_history(0.0)
    v, h = assess(h, obs(2, health=health(2, False)), 2, S, mode="serving")
    assert v.status == "degraded"
    v, h = assess(h, obs(4, health=health(4, False)), 4, S, mode="serving")
    assert v.status == "degraded"
    v, h = assess(h, obs(6), 6, S, mode="serving")  # no probe finished this poll: unchanged
    assert v.status == "degraded"
    v, h = assess(h, obs(8, health=health(8, False)), 8, S, mode="serving")
    assert v.cause == "unhealthy"
    # The outage counts from the first failed check's start (issue 49: detection was 0.0 here).
    assert dict(v.figures)["since_first_failure_s"] == 8 - (2 - health(2, False).latency_s)


def test_slow_successful_health_is_healthy_and_recovers() -> None:
    h = new_history(0.0)
    v, h = assess(h, obs(2, health=health(2, False)), 2, S, mode="serving")
    v, h = assess(h, obs(4, health=health(4, True, latency=1.4)), 4, S, mode="serving")
    assert v.status == "ready"


def test_serving_stall_with_health_ok() -> None:
    h = new_history(0.0)
    seq = [obs(2.0 * i, health=health(2.0 * i, True), serving=sv(2.0 * i, 4, 1000)) for i in range(1, 60)]
    v, _ = run(h, seq, mode="serving")
    assert v.cause == "serving_stall"


def test_serving_stall_seen_through_open_requests_when_gauges_say_idle() -> None:
    """Real SGLang at tp 2: the stall followed a prefill line, so the scheduler's gauges froze at 0
    running, 0 queued; the HTTP front still held 4 generation requests open."""

    def frozen(t: float) -> ServingObservation:
        return ServingObservation(
            at=t, available=True, running_reqs=0, queue_reqs=0, decode_tokens_total=8540, active_requests=4
        )

    seq = [obs(1.0 * i, health=health(1.0 * i, True), serving=frozen(1.0 * i)) for i in range(1, 80)]
    v, _ = run(new_history(0.0), seq, mode="serving")
    assert v.cause == "serving_stall" and "4 open at the HTTP front" in v.reason
    idle = [
        obs(
            1.0 * i,
            serving=ServingObservation(
                at=1.0 * i, available=True, running_reqs=0, queue_reqs=0, decode_tokens_total=8540, active_requests=0
            ),
        )
        for i in range(1, 300)
    ]
    assert run(new_history(0.0), idle, mode="serving")[0].status == "ready"


def test_steady_traffic_is_never_a_stall() -> None:
    seq = [obs(2.0 * i, serving=sv(2.0 * i, 4, 100.0 * i)) for i in range(1, 300)]
    v, _ = run(new_history(0.0), seq, mode="serving")
    assert v.status == "ready"


def test_idle_server_with_frozen_gauges_is_not_a_stall() -> None:
    seq = [obs(2.0 * i, serving=sv(2.0 * i, 0, 5000)) for i in range(1, 300)]
    v, _ = run(new_history(0.0), seq, mode="serving")
    assert v.status == "ready"


def test_rank_death_at_next_poll() -> None:
    procs = (proc(100), proc(101, "scheduler"), proc(102, "scheduler"), proc(103, "detokenizer"))
    h = new_history(0.0)
    v, h = assess(h, obs(2, procs=procs), 2, S, mode="serving")
    assert v.status == "ready"
    v, h = assess(h, obs(4, procs=procs[:2] + procs[3:]), 4, S, mode="serving")
    assert v.cause == "rank_died" and "102" in v.reason
    zombie = (proc(100), proc(101, "scheduler", status="zombie"), proc(103, "detokenizer"))
    v, _ = assess(new_history(0.0), obs(2, procs=procs[:2] + procs[3:]), 2, S, mode="serving")
    v, _ = assess(_, obs(4, procs=zombie), 4, S, mode="serving")
    assert v.cause == "rank_died"


def test_low_acceptance_under_traffic_is_spec_regression() -> None:
    seq = [obs(2.0 * i, serving=sv(2.0 * i, 4, 100.0 * i, accept=1.15)) for i in range(1, 100)]
    v, _ = run(new_history(0.0), seq, mode="serving", speculative=True)
    assert v.status == "degraded" and v.cause == "spec_regression"


def test_good_acceptance_or_idle_or_no_speculation_is_not_regression() -> None:
    good = [obs(2.0 * i, serving=sv(2.0 * i, 4, 100.0 * i, accept=3.1)) for i in range(1, 100)]
    assert run(new_history(0.0), good, mode="serving", speculative=True)[0].status == "ready"
    idle = [obs(2.0 * i, serving=sv(2.0 * i, 0, 100.0, accept=1.0)) for i in range(1, 100)]
    assert run(new_history(0.0), idle, mode="serving", speculative=True)[0].status == "ready"
    low = [obs(2.0 * i, serving=sv(2.0 * i, 4, 100.0 * i, accept=1.1)) for i in range(1, 100)]
    assert run(new_history(0.0), low, mode="serving", speculative=False)[0].status == "ready"


def test_zero_acceptance_before_the_first_decode_interval_is_no_reading() -> None:
    seq = [obs(2.0 * i, serving=sv(2.0 * i, 4, 100.0 * i, accept=0.0)) for i in range(1, 100)]
    v, h = run(new_history(0.0), seq, mode="serving", speculative=True)
    assert v.status == "ready" and h.accept_samples == ()


def test_acceptance_from_decode_lines_without_metrics() -> None:
    seq = [
        obs(2.0 * i, decode=DecodeStats(at=2.0 * i, running_reqs=3, queue_reqs=0, gen_throughput=50, accept_len=1.1))
        for i in range(1, 100)
    ]
    v, _ = run(new_history(0.0), seq, mode="serving", speculative=True)
    assert v.cause == "spec_regression"


def test_history_is_not_mutated() -> None:
    h = new_history(0.0)
    before = replace(h)
    assess(h, obs(2, lines=50), 2, S, mode="starting")
    assert h == before


# ---- process state as evidence (issue 51) -------------------------------------------------------------

TREE = (proc(100), proc(101, "scheduler"), proc(103, "detokenizer"))


def with_state(pid: int, status: str) -> tuple:  # type: ignore[type-arg]
    return tuple(replace(p, status=status) if p.pid == pid else p for p in TREE)


def timeout(at: float) -> HealthObservation:
    return HealthObservation(at=at, ok=False, status_code=None, latency_s=30.0, error="timeout")


OK = "sleeping"
# (case, per poll every 2 s: (the stopped pid or None, its status letter name, health at that poll: True ok,
#  False failed, None none finished), the poll index of the verdict or None, what the reason names)
STOPPED_CASES = [
    (
        "a front end stopped for polls, then its first failed health check: judged at that poll",
        [(100, "stopped", None), (100, "stopped", None), (100, "stopped", None), (100, "stopped", False)],
        3,
        "the server's main process (HTTP front end) pid 100 stopped",
    ),
    (
        "health failed first, the scheduler stopped at the next two polls: judged at the second",
        [(None, OK, False), (101, "stopped", None), (101, "stopped", None)],
        2,
        "scheduler pid 101 stopped",
    ),
    (
        "a detokenizer stopped at one poll only (then running) while health fails: no verdict of its own",
        [(None, OK, False), (103, "stopped", None), (None, OK, None), (None, OK, None)],
        None,
        "",
    ),
    (
        "a person's debugger stops the front end for polls while health answers: no verdict",
        [(100, "stopped", True), (100, "stopped", True), (100, "stopped", None), (100, "stopped", True)],
        None,
        "",
    ),
    (
        "the daemon's own capture (a tracer's stop, state t) while health fails once: no verdict",
        [(101, "tracing-stop", None), (101, "tracing-stop", False), (101, "tracing-stop", None)],
        None,
        "",
    ),
    (
        "a stop that ended before health failed is not held against the server",
        [(100, "stopped", None), (100, "stopped", None), (None, OK, False), (None, OK, None)],
        None,
        "",
    ),
]


@pytest.mark.parametrize(("case", "polls", "at", "named"), STOPPED_CASES, ids=[c[0] for c in STOPPED_CASES])
def test_a_stopped_process_while_health_fails_is_judged_at_the_next_poll(
    case: str, polls: list[tuple[int | None, str, bool | None]], at: int | None, named: str
) -> None:
    h = new_history(0.0)
    verdicts = []
    for i, (pid, status, ok) in enumerate(polls):
        t = 2.0 * (i + 1)
        hv = None if ok is None else (health(t, True) if ok else timeout(t))
        procs = with_state(pid, status) if pid is not None else TREE
        v, h = assess(h, obs(t, procs=procs, health=hv), t, S, mode="serving")
        verdicts.append(v)
        if v.is_incident:
            break
    incidents = [i for i, v in enumerate(verdicts) if v.is_incident]
    if at is None:
        assert not incidents, (case, verdicts[-1])
        return
    assert incidents == [at], (case, [v.reason for v in verdicts])
    v = verdicts[at]
    assert v.cause == "unhealthy" and named in v.reason and "(state T" in v.reason, v.reason
    figures = dict(v.figures)
    # One failed health check, not `health_failures` (3) of them.
    assert figures["health_failures"] == 1.0 and figures["stopped_s"] >= 2.0, figures
    assert figures["stopped_pid"] == float(int(named.split("pid ")[1].split()[0]))


# ---- wedges with /health 200: accepted, never started (issue 51) ----------------------------------------

SGLANG_QUEUED = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} RUNNING
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} QUEUED
# TYPE sglang:realtime_tokens counter
sglang:realtime_tokens_total{mode="decode",model_name="m"} TOKENS
"""
VLLM_QUEUED = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} RUNNING
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} QUEUED
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 40.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} TOKENS
"""


def scrape(engine: str, at: float, running: float, queued: float, tokens: float) -> ServingObservation:
    from probes.serving import parse_metrics
    from supervisor.engines import SGLANG, VLLM

    text, names = (SGLANG_QUEUED, SGLANG.metrics) if engine == "sglang" else (VLLM_QUEUED, VLLM.metrics)
    body = text.replace("RUNNING", str(running)).replace("QUEUED", str(queued)).replace("TOKENS", str(tokens))
    return parse_metrics(body, at, names)


# (case, per poll: running, queued, token counter at poll i; the poll the stall comes at or None)
WEDGES = [
    # SGLang #40809 / #28815 shapes: accepted, nothing runs, the counters stand, /health says 200.
    ("accepted_never_started", lambda i: (0.0, 3.0, 5000.0), 30),
    # A full batch with a queue behind it is serving: its tokens move.
    ("queued_behind_a_moving_batch", lambda i: (8.0, 3.0, 5000.0 + 40 * i), None),
    # An idle server's frozen counters are no wedge.
    ("idle", lambda i: (0.0, 0.0, 5000.0), None),
]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize(("case", "shape", "at"), WEDGES, ids=[w[0] for w in WEDGES])
def test_requests_accepted_and_never_started_are_a_serving_stall_with_health_200(
    engine: str, case: str, shape, at: int | None  # type: ignore[no-untyped-def]
) -> None:
    s = S.model_copy(update={"serving_stall_s": 60.0})
    h = new_history(0.0)
    v = None
    for i in range(1, 80):
        t = 2.0 * i
        running, queued, tokens = shape(i)
        o = obs(t, health=health(t, True), serving=scrape(engine, t, running, queued, tokens))
        v, h = assess(h, o, t, s, mode="serving")
        if v.is_incident:
            break
    assert v is not None
    if at is None:
        assert v.status == "ready", (engine, case, v)
        return
    assert v.cause == "serving_stall" and i == at + 1, (engine, case, i, v)  # 60 s after the first poll
    assert "3 accepted requests wait and none runs" in v.reason, v.reason
    assert dict(v.figures)["queue_reqs"] == 3.0


def test_a_clock_jump_between_polls_counts_against_no_window() -> None:
    """Issue 50: a poll gap far past any poll interval (the clock jumped +1 h, or the daemon was stopped)
    is time the daemon did not watch. A quiet start is judged after a window of watched quiet, the
    backstop after `startup_timeout_s` watched, and the rates of the poll after the gap stay rates."""
    quiet = [obs(2.0 * i) for i in range(1, 6)] + [obs(3610.0 + 2.0 * i) for i in range(0, 40)]
    h = new_history(0.0)
    verdicts = []
    for o in quiet:
        v, h = assess(h, o, o.at, S, mode="starting")
        verdicts.append((o.at, v))
        if v.is_incident:
            break
    at, v = verdicts[-1]
    assert v.cause == "startup_stall", v
    # Not at once: the window (60 s) less the 10 s watched before and the 20 s of the gap counted as a
    # slow poll (ten poll intervals) is left after the jump.
    assert at - 3610.0 >= S.startup_stall_s - 10 - 20 - 2, at
    assert dict(v.figures)["unwatched_s"] > 3500
    assert "the daemon did not watch not counted (its clock jumped, or it was stopped)" in v.reason, v.reason
    assert h.watched_since_launch(at) < 200
    # The CPU the tree used across the gap is a rate over the time watched, not over the hour.
    h = new_history(0.0)
    _, h = assess(h, obs(2.0, cpu=1.0), 2.0, S, mode="starting")
    v, h = assess(h, obs(3602.0, cpu=40.0), 3602.0, S, mode="starting")
    assert "cpu" in v.moved and v.status == "starting"


def test_a_clock_jump_while_serving_is_no_serving_stall() -> None:
    h = new_history(0.0)
    seq = [obs(2.0 * i, health=health(2.0 * i, True), serving=sv(2.0 * i, 4, 1000 + i)) for i in range(1, 5)]
    seq += [obs(3608.0, health=health(3608.0, True), serving=sv(3608.0, 4, 1004))]  # the jump, no token yet
    v, h = run(h, seq, mode="serving")
    assert not v.is_incident, v
    at = [3608.0 + 2 * i for i in range(1, 60)]
    later = [obs(t, health=health(t, True), serving=sv(t, 4, 1004)) for t in at]
    v, _ = run(h, later, mode="serving")
    assert v.cause == "serving_stall" and dict(v.figures)["since_tokens_s"] >= 3600
