"""vLLM 0.26.0's Prometheus metrics, kept in the API server as vLLM keeps them (v1/metrics/loggers.py:443-1296,
v1/spec_decode/metrics.py:185-281): real prometheus_client families with vLLM's names, documentation,
buckets and labels (`model_name`, `engine`), created when the server comes up and updated from each
engine step's outputs. With `--disable-log-stats` no `vllm:` family exists at all (async_llm.py:155-166
builds the StatLoggerManager only with log_stats). The registry also holds what vLLM's default
REGISTRY does: the process, platform and GC collectors and prometheus-fastapi-instrumentator's
`http_requests_total` (entrypoints/serve/instrumentator/metrics.py:60-78, `/metrics` and the health
routes excluded).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from supervisor.simulator.vllm.messages import EngineOutputs

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LABELS = ["model_name", "engine"]
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # v1/engine/__init__.py:30
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")  # v1/metrics/stats.py:316-320
EXCLUDED_HANDLERS = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")
TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """loggers.py:1283-1308."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


class VllmMetrics:
    def __init__(self, model_name: str, max_model_len: int, spec_tokens: int | None, log_stats: bool) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self._lock = threading.Lock()
        self.http = Counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            ["method", "status", "handler"],
            registry=self.registry,
        )
        self.enabled = log_stats
        if log_stats:
            self._families(model_name, max_model_len, spec_tokens)

    def _families(self, model: str, max_model_len: int, spec_tokens: int | None) -> None:
        r, values = self.registry, [model, "0"]
        lengths = build_1_2_5_buckets(max_model_len)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=r, multiprocess_mode="mostrecent").labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, LABELS, registry=r, buckets=buckets).labels(*values)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.",
            [*LABELS, "reason"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.waiting_capacity = by_reason.labels(*values, "capacity")
        by_reason.labels(*values, "deferred")
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            [*LABELS, "sleep_state"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(*values, state).set(value)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.")
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        by_source = Counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", [*LABELS, "source"], registry=r
        )
        self.prompt_computed = by_source.labels(*values, "local_compute")
        for source in PROMPT_SOURCES[1:]:
            by_source.labels(*values, source)
        counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=r,
        )
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        self.request_prompt = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", lengths)
        self.request_generation = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", lengths
        )
        self.iteration = histogram(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS
        )
        histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            lengths,
        )
        self.params_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.", [1, 2, 5, 10, 20])
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", lengths
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS
        )
        for name, doc in (
            ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
            ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
            ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
        ):
            histogram(name, doc, LATENCY_BUCKETS)
        histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            lengths,
        )
        self.spec = None
        if spec_tokens is not None:
            self.spec = (
                counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
            )
            per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                [*LABELS, "position"],
                registry=r,
            )
            self.per_pos = [per_pos.labels(*values, str(pos)) for pos in range(spec_tokens)]

    def record(self, out: EngineOutputs, generated: int, finished: Sequence[tuple[int, int, float, float]]) -> None:
        """PrometheusStatLogger.record (loggers.py:1104-1260): the scheduler's gauges, the step's counters, and
        each finished request's (prompt tokens, generated tokens, time to first token, e2e latency)."""
        if not self.enabled or not out.log_stats:
            return
        with self._lock:
            self.running.set(out.running)
            self.waiting.set(out.waiting)
            self.waiting_capacity.set(out.waiting)
            self.kv_usage.set(out.kv_usage)
            self.prefix_queries.inc(out.prefix_queries)
            if self.spec is not None and out.spec is not None:
                drafts, draft_tokens, accepted = self.spec
                drafts.inc(out.spec.num_drafts)
                draft_tokens.inc(out.spec.num_draft_tokens)
                accepted.inc(out.spec.num_accepted_tokens)
                for counter, n in zip(self.per_pos, out.spec.accepted_per_pos, strict=False):
                    counter.inc(n)
            self.prompt_tokens.inc(out.prompt_tokens)
            self.prompt_computed.inc(out.prompt_tokens)
            self.generation_tokens.inc(generated)
            self.iteration.observe(out.prompt_tokens + generated)
            for prompt, gen, ttft, e2e in finished:
                self.success["length"].inc()
                self.request_prompt.observe(prompt)
                self.request_generation.observe(gen)
                self.params_n.observe(1)
                self.params_max_tokens.observe(gen)
                self.ttft.observe(ttft)
                # observed when the request ends (loggers.py's finished-request stats); the simulator's
                # wait in WAITING is its time to first token, its prefill step included
                self.queue_time.observe(ttft)
                self.e2e.observe(e2e)

    def request_done(self, handler: str, method: str, status: int) -> None:
        if handler not in EXCLUDED_HANDLERS:
            self.http.labels(method, f"{status // 100}xx", handler).inc()

    def render(self) -> bytes:
        with self._lock:
            return generate_latest(self.registry)
