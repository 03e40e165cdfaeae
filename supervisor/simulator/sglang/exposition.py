"""SGLang 0.5.16's Prometheus exposition, rendered at scrape time from the tokenizer manager's snapshot.

Scheduler gauges carry `engine_type, model_name, moe_ep_rank, pp_rank, tp_rank` (in that order: the
multiprocess collector sorts label names) and exist only once rank 0 has published them (after the
first prefill or decode log); they freeze while the scheduler hangs, because nothing new arrives.
Tokenizer counters and histograms carry `engine_type, model_name`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from supervisor.simulator.sglang.httpstats import HttpStats
from supervisor.simulator.sglang.tokenizer import MetricsSnapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_GAUGES = (
    ("num_running_reqs", "The number of running requests."),
    ("num_used_tokens", "The number of used tokens."),
    ("token_usage", "The token usage."),
    ("gen_throughput", "The generation throughput (token/s)."),
    ("num_queue_reqs", "The number of requests in the waiting queue."),
    ("cache_hit_rate", "The prefix cache hit rate."),
    ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
    (
        "spec_accept_length",
        "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
    ),
    ("spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."),
    (
        "spec_cap_length",
        "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot (0 when no cap is "
        "scheduled).",
    ),
    (
        "spec_block_accept_length",
        "Mean uncapped full-block accept length per verify step (accept + cap-trimmed drafts; exact only in DSpark "
        "cap-accept mode).",
    ),
    ("spec_num_steps", "Currently active speculative_num_steps."),
    ("spec_num_draft_tokens", "Currently active speculative_num_draft_tokens (decouples from steps under topk>1)."),
    ("is_cuda_graph", "Whether the batch is using CUDA graph."),
)


class SGLangCollector(Collector):
    def __init__(self, snapshot: Callable[[], MetricsSnapshot], model_name: str, http: HttpStats | None = None) -> None:
        self._snapshot = snapshot
        self._model_name = model_name
        self._http = http

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        tokenizer = ["engine_type", "model_name"]
        name = ["unified", self._model_name]
        labels = ["engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"]
        values = ["unified", self._model_name, "0", "0", "0"]
        if snap.stats is not None and snap.stats.spec_verify_calls > 0:  # appears once incremented
            verify = CounterMetricFamily(
                "sglang:spec_verify_calls", "Number of speculative decoding verification calls.", labels=tokenizer
            )
            verify.add_metric(name, snap.stats.spec_verify_calls)
            yield verify
        if snap.stats is not None:
            for field, doc in _GAUGES:
                gauge = GaugeMetricFamily(f"sglang:{field}", doc, labels=labels)
                gauge.add_metric(values, float(getattr(snap.stats, field)))
                yield gauge
        counters = (
            ("prompt_tokens", "Number of prefill tokens processed.", snap.prompt_tokens_total),
            ("generation_tokens", "Number of generation tokens processed.", snap.generation_tokens_total),
            ("num_requests", "Number of requests processed.", snap.num_requests_total),
            ("num_aborted_requests", "Number of requests aborted.", snap.num_aborted_requests_total),
        )
        for field, doc, value in counters:
            counter = CounterMetricFamily(f"sglang:{field}", doc, labels=tokenizer)
            counter.add_metric(name, float(value))
            yield counter
        realtime = CounterMetricFamily(
            "sglang:realtime_tokens",
            "Total number of tokens processed (updated on each log interval). mode: prefill_compute, prefill_cache, "
            "decode.",
            labels=[*labels, "mode"],
        )
        realtime.add_metric([*values, "prefill_compute"], float(snap.realtime_prefill_tokens_total))
        realtime.add_metric([*values, "decode"], float(snap.realtime_decode_tokens_total))
        yield realtime
        ttft = HistogramMetricFamily(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            labels=tokenizer,
        )
        ttft.add_metric(name, snap.ttft, snap.ttft_sum)
        yield ttft
        e2e = HistogramMetricFamily(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
            labels=tokenizer,
        )
        e2e.add_metric(name, snap.e2e, snap.e2e_sum)
        yield e2e
        queue = HistogramMetricFamily(
            "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", labels=labels
        )
        queue.add_metric(values, snap.queue, snap.queue_sum)
        yield queue
        if self._http is not None:
            yield from _http_families(self._http)


def _http_families(http: HttpStats) -> Iterator[Metric]:
    requests, responses, active = http.snapshot()
    total = CounterMetricFamily(
        "sglang:http_requests", "Total number of HTTP requests by endpoint and method", labels=["endpoint", "method"]
    )
    for (endpoint, method), n in sorted(requests.items()):
        total.add_metric([endpoint, method], float(n))
    yield total
    answered = CounterMetricFamily(
        "sglang:http_responses",
        "Total number of HTTP responses by endpoint and status code",
        labels=["endpoint", "status_code", "method"],
    )
    for (endpoint, status, method), n in sorted(responses.items()):
        answered.add_metric([endpoint, status, method], float(n))
    yield answered
    live = GaugeMetricFamily(
        "sglang:http_requests_active", "Number of currently active HTTP requests", labels=["endpoint", "method"]
    )
    for (endpoint, method), n in sorted(active.items()):
        live.add_metric([endpoint, method], float(n))
    yield live


def render(snapshot: Callable[[], MetricsSnapshot], model_name: str, http: HttpStats | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SGLangCollector(snapshot, model_name, http))
    return generate_latest(registry)
