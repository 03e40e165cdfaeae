from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from httpserver import QuietHandler, serving
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.serving import ServingProbe, accept_length_from_server_info, parse_metrics
from probes.types import ServingObservation

LABELS = 'engine_type="unified",model_name="kimi-k2.5",moe_ep_rank="0",pp_rank="0"'

# Shaped like SGLang's /metrics under Prometheus multiprocess mode, TP2 without data parallelism.
SGLANG_METRICS = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{LABELS},tp_rank="0"}} 3.0
sglang:num_running_reqs{{{LABELS},tp_rank="1"}} 3.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{LABELS},tp_rank="0"}} 1.0
sglang:num_queue_reqs{{{LABELS},tp_rank="1"}} 1.0
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{{LABELS},tp_rank="0"}} 123.45
sglang:gen_throughput{{{LABELS},tp_rank="1"}} 123.45
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{{LABELS},tp_rank="0"}} 0.01
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{{{LABELS},tp_rank="0"}} 3.0
sglang:spec_accept_length{{{LABELS},tp_rank="1"}} 2.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="kimi-k2.5"}} 98765.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="kimi-k2.5"}} 4321.0
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{{model_name="kimi-k2.5"}} 42.0
# HELP sglang:realtime_tokens_total Total number of tokens processed (updated on each log interval).
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{{{LABELS},mode="prefill_compute",tp_rank="0"}} 4000.0
sglang:realtime_tokens_total{{{LABELS},mode="decode",tp_rank="0"}} 90000.0
sglang:realtime_tokens_total{{{LABELS},mode="decode",tp_rank="1"}} 90000.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{{le="0.1",model_name="kimi-k2.5"}} 10.0
sglang:time_to_first_token_seconds_bucket{{le="+Inf",model_name="kimi-k2.5"}} 42.0
sglang:time_to_first_token_seconds_sum{{model_name="kimi-k2.5"}} 12.5
sglang:time_to_first_token_seconds_count{{model_name="kimi-k2.5"}} 42.0
# HELP sglang:queue_time_seconds Histogram of queueing time in seconds.
# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_bucket{{{LABELS},le="+Inf",tp_rank="0"}} 44.0
sglang:queue_time_seconds_sum{{{LABELS},tp_rank="0"}} 0.5
sglang:queue_time_seconds_count{{{LABELS},tp_rank="0"}} 44.0
sglang:queue_time_seconds_count{{{LABELS},tp_rank="1"}} 44.0
"""


def test_parse_sglang_metrics() -> None:
    assert parse_metrics(SGLANG_METRICS, at=5.0) == ServingObservation(
        at=5.0,
        available=True,
        running_reqs=3.0,
        queue_reqs=1.0,
        generation_tokens_total=98765.0,
        decode_tokens_total=90000.0,
        num_requests_total=42.0,
        gen_throughput=123.45,
        spec_accept_length=2.5,
        started_total=44.0,  # issue 51: the queue-time count, one per batch (tp ranks repeat it)
        first_tokens_total=42.0,
    )


def test_data_parallel_ranks_add_up_and_tensor_parallel_ranks_do_not() -> None:
    text = "\n".join(
        f'sglang:num_running_reqs{{dp_rank="{dp}",tp_rank="{tp}",pid="{100 + tp}"}} {running}'
        for dp, running in ((0, 4.0), (1, 6.0))
        for tp in range(4)
    )
    text += '\nsglang:num_queue_reqs{dp_rank="0",tp_rank="0"} 2\nsglang:num_queue_reqs{dp_rank="0",tp_rank="1"} 0\n'
    obs = parse_metrics(text, at=0.0)
    assert obs.running_reqs == 10.0
    assert obs.queue_reqs == 2.0  # a stale replica reading lower never hides a queue


def test_older_build_without_new_series() -> None:
    text = 'sglang:num_running_reqs{tp_rank="0"} 0\nsglang:generation_tokens_total{model_name="m"} 5\n'
    obs = parse_metrics(text, at=1.0)
    assert obs.available
    assert (obs.running_reqs, obs.generation_tokens_total) == (0.0, 5.0)
    assert (obs.decode_tokens_total, obs.spec_accept_length, obs.queue_reqs) == (None, None, None)


def test_non_finite_values_are_ignored() -> None:
    text = 'sglang:spec_accept_length{tp_rank="0"} NaN\nsglang:gen_throughput{tp_rank="0"} +Inf\n'
    obs = parse_metrics(text, at=1.0)
    assert obs.available
    assert (obs.spec_accept_length, obs.gen_throughput) == (None, None)


def test_empty_body_is_available_with_nothing_in_it() -> None:
    assert parse_metrics("", at=1.0) == ServingObservation(at=1.0, available=True)


@pytest.mark.parametrize(
    "text",
    ["<html><body>502 Bad Gateway</body></html>", "sglang:num_running_reqs{tp_rank=", "sglang:gen_throughput x\n"],
)
def test_garbage_is_unavailable(text: str) -> None:
    obs = parse_metrics(text, at=2.0)
    assert not obs.available
    assert obs.error.startswith("unparseable metrics")
    assert obs.running_reqs is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_fuzz_bytes_never_raise(data: bytes) -> None:
    obs = parse_metrics(data.decode("utf-8", "replace"), at=0.0)
    assert obs.available or obs.error


METRIC_FRAGMENTS = [
    "sglang:num_running_reqs",
    "sglang:generation_tokens_total",
    "sglang:realtime_tokens_total",
    '{tp_rank="0"}',
    '{mode="decode",tp_rank="1"}',
    "{",
    "}",
    '="',
    " ",
    "1.5",
    "NaN",
    "-Inf",
    "\n",
    "# TYPE sglang:num_running_reqs gauge\n",
    "# HELP x y\n",
    "_bucket",
    'le="+Inf"',
    "\\",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(METRIC_FRAGMENTS), max_size=40).map("".join))
def test_fuzz_metric_shaped_text_never_raises(text: str) -> None:
    parse_metrics(text, at=0.0)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"internal_states": [{"avg_spec_accept_length": 3.0}, {"avg_spec_accept_length": 2.0}]}, 2.5),
        ({"internal_states": [{"last_gen_throughput": 10.0, "memory_usage": {"weight": 1}}]}, None),
        ({"internal_states": [{"avg_spec_accept_length": 0.0}]}, None),
        ({"internal_states": [{"avg_spec_accept_length": "3"}, 5, None, {"avg_spec_accept_length": 1.5}]}, 1.5),
        ({"internal_states": [{"avg_spec_accept_length": True}]}, None),
        ({"internal_states": [{"avg_spec_accept_length": float("nan")}]}, None),
        ({"internal_states": {"avg_spec_accept_length": 2.0}}, None),
        ({"avg_spec_accept_length": 1.75}, 1.75),
        ({"internal_states": []}, None),
        ([], None),
        (None, None),
        ("avg_spec_accept_length", None),
    ],
)
def test_accept_length_from_server_info(data: object, expected: float | None) -> None:
    assert accept_length_from_server_info(data) == expected


def transport(status: int, body: bytes = b"") -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, content=body))


class Ticks:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.parametrize(
    ("mock", "available", "error"),
    [
        (transport(200, SGLANG_METRICS.encode()), True, ""),
        (transport(404, b"Not Found"), False, "metrics not enabled"),
        (transport(500, b"oops"), False, "HTTP 500"),
        (transport(200, b"\x00\xff garbage {{{"), False, "unparseable metrics"),
        (transport(200, b"# " + b"x" * (4 * 1024 * 1024)), False, "body over 4194304 bytes"),
    ],
)
async def test_serving_probe_outcomes(mock: httpx.MockTransport, available: bool, error: str) -> None:
    async with httpx.AsyncClient(transport=mock) as client:
        probe = ServingProbe("http://127.0.0.1:30000", "/metrics", 1.0, client=client, monotonic=Ticks())
        obs = await probe.observe()
    assert obs.available is available
    assert obs.error.startswith(error) if error else obs.error == ""
    assert obs.at == 13.0  # the read after the fetch's two
    if available:
        assert obs.running_reqs == 3.0


async def test_a_50_mb_body_is_not_read_whole() -> None:
    produced = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal produced
        for _ in range(50):
            produced += 1
            yield b"#" * (1024 * 1024)

    mock = httpx.MockTransport(lambda request: httpx.Response(200, content=chunks()))
    async with httpx.AsyncClient(transport=mock) as client:
        obs = await ServingProbe("http://h", "/metrics", 5.0, client=client).observe()
    assert (obs.available, obs.error) == (False, "body over 4194304 bytes")
    assert produced <= 6


async def test_timeout_from_the_mock() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(slow)) as client:
        obs = await ServingProbe("http://h", "/metrics", 0.05, client=client).observe()
    assert (obs.available, obs.error) == (False, "timeout")


class SlowMetrics(QuietHandler):
    def do_GET(self) -> None:
        if self.path == "/slow":
            self.server.stop.wait(10.0)  # far past the probe's 0.3 s; teardown ends it
        known = self.path in ("/metrics", "/slow")
        self.reply(200 if known else 404, SGLANG_METRICS.encode() if known else b"Not Found")


@pytest.fixture
def server() -> Iterator[str]:
    with serving(SlowMetrics) as url:
        yield url


async def test_against_a_real_server(server: str) -> None:
    good = ServingProbe(server, "/metrics", 5.0)  # generous: a loaded CI machine is slow to answer
    slow = ServingProbe(server, "/slow", 0.3)
    missing = ServingProbe(server, "metrics-off", 5.0)
    try:
        started = time.monotonic()
        results = await asyncio.gather(good.observe(), slow.observe(), missing.observe())
        elapsed = time.monotonic() - started
    finally:
        for probe in (good, slow, missing):
            await probe.aclose()
    assert results[0].available and results[0].decode_tokens_total == 90000.0
    assert (results[1].available, results[1].error) == (False, "timeout")
    assert (results[2].available, results[2].error) == (False, "metrics not enabled")
    assert elapsed < 5.0  # the slow probe gave up at its timeout, not when the server's 10 s wait ended


REAL = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "real_sglang").glob("0.5.16-*"))


@pytest.mark.parametrize("run", REAL, ids=lambda p: p.name)
def test_real_sglang_metrics_idle_load_stalled(run: Path) -> None:
    """Real SGLang 0.5.16 expositions: idle has nothing in flight; under 4 clients and after a
    scheduler was SIGSTOPped, 4 generation requests stay open at the HTTP front while decode stops."""
    idle, load, stalled = (parse_metrics((run / f"metrics_{n}.txt").read_text(), 0.0)
                           for n in ("idle", "load", "stalled"))
    assert idle.available and idle.running_reqs == 0 and idle.active_requests == 0
    assert load.running_reqs == 4 and load.active_requests == 4
    assert load.decode_tokens_total is not None and idle.decode_tokens_total is not None
    assert load.decode_tokens_total > idle.decode_tokens_total
    assert stalled.active_requests == 4  # /health and /metrics are open too, but are not generation
    assert stalled.spec_accept_length == 1.0  # the random EAGLE-3 draft: every draft token rejected


def test_active_requests_leave_out_probes_and_info_routes() -> None:
    text = """\
# HELP sglang:http_requests_active Number of currently active HTTP requests
# TYPE sglang:http_requests_active gauge
sglang:http_requests_active{endpoint="/health",method="GET"} 1.0
sglang:http_requests_active{endpoint="/metrics",method="GET"} 1.0
sglang:http_requests_active{endpoint="/get_server_info",method="GET"} 2.0
sglang:http_requests_active{endpoint="/generate",method="POST"} 3.0
sglang:http_requests_active{endpoint="/v1/chat/completions",method="POST"} 2.0
"""
    assert parse_metrics(text, 0.0).active_requests == 5
    assert parse_metrics("", 0.0).active_requests is None  # older builds: no such gauge, no opinion
