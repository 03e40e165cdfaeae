"""The server's own Prometheus metrics: requests, token counters, acceptance (the families per engine
come from its profile, supervisor/engines; SGLang's need `--enable-metrics`, vLLM's are always on).

How series are combined: the scheduler publishes gauges with labels such as `tp_rank`, `dp_rank`,
`model_name` (and `pid` under Prometheus' multiprocess mode). Tensor-parallel ranks of one
scheduler group run the same batch, so their series repeat one number: take the largest over
`tp_rank`, `moe_ep_rank` (SGLang 0.5.16 labels every scheduler series with it; expert-parallel
ranks of one group run the same batch too) and `pid`. Any other label set (a data-parallel
rank, another model) is a different batch, so those add up. Acceptance length is a per-step
mean, so it is averaged, never added.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from probes.http import describe_error, fetch, join_url, make_client
from probes.types import ServingObservation, SpecCounts
from supervisor.engines import SGLANG
from supervisor.engines.profile import MetricNames

MAX_METRICS_BYTES = 4 * 1024 * 1024  # SGLang with TP8 and histograms is a few hundred KB


def _wanted(names: MetricNames) -> frozenset[str]:
    return frozenset(
        n
        for n in (
            names.running,
            names.queued,
            names.generation_tokens,
            names.step_tokens,
            names.requests,
            names.throughput,
            names.accept_length,
            names.drafts,
            names.accepted_tokens,
            names.http_active,
            names.queue_time_count,
            names.first_token_count,
        )
        if n
    )


# Routes that generate nothing a client waits for (or are the daemon's own probes): not "requests in flight".
_NOT_GENERATION = frozenset(
    {
        "/health",
        "/health_generate",
        "/metrics",
        "/model_info",
        "/get_model_info",
        "/server_info",
        "/get_server_info",
        "/v1/models",
        "/get_load",
        "/ping",
        "/",
    }
)


@dataclass(frozen=True)
class _Sample:
    name: str  # the sample's own name: counters keep `_total` here, unlike their family's name
    labels: tuple[tuple[str, str], ...]
    value: float


def parse_metrics(
    text: str, at: float, names: MetricNames = SGLANG.metrics, before: SpecCounts | None = None
) -> ServingObservation:
    """The serving view from a Prometheus text body; unavailable (never an exception) on garbage.

    An engine that counts drafts and accepted tokens (vLLM) gets its acceptance length over the
    drafts since `before` (the previous scrape's counts): 1 + accepted / drafts, vLLM's own
    definition (v1/spec_decode/metrics.py), for this interval rather than since the start."""
    try:
        samples = _wanted_samples(text, _wanted(names))
    except Exception as err:  # the parser raises ValueError, IndexError, ... on a malformed line
        return ServingObservation(at=at, available=False, error=f"unparseable metrics: {describe_error(err)}")
    replicas = names.replica_labels
    step = samples.get(names.step_tokens, []) if names.step_tokens else []
    if names.step_label is not None:
        key, want = names.step_label
        step = [s for s in step if dict(s.labels).get(key) == want]
    accept = _mean(samples.get(names.accept_length)) if names.accept_length else None
    counts = None
    if names.drafts:
        drafts = _combine(samples.get(names.drafts), replicas)
        accepted = _combine(samples.get(names.accepted_tokens), replicas)
        if drafts is not None and accepted is not None:
            counts = SpecCounts(drafts, accepted)
            accept = counts.accept_length_since(before)
    return ServingObservation(
        at=at,
        available=True,
        running_reqs=_combine(samples.get(names.running), replicas),
        queue_reqs=_combine(samples.get(names.queued), replicas),
        generation_tokens_total=_combine(samples.get(names.generation_tokens), replicas),
        decode_tokens_total=_combine(step, replicas) if names.step_tokens else None,
        num_requests_total=_combine(samples.get(names.requests), replicas),
        gen_throughput=_combine(samples.get(names.throughput), replicas) if names.throughput else None,
        spec_accept_length=accept,
        active_requests=_active(samples.get(names.http_active)) if names.http_active else None,
        spec_counts=counts,
        started_total=_combine(samples.get(names.queue_time_count), replicas) if names.queue_time_count else None,
        first_tokens_total=(
            _combine(samples.get(names.first_token_count), replicas) if names.first_token_count else None
        ),
    )


def _active(samples: Iterable[_Sample] | None) -> float | None:
    """Generation requests the HTTP front holds open. SGLang's scheduler gauges are refreshed only per
    logged batch and freeze with the scheduler (a stall right after a prefill line leaves them at 0
    running, 0 queued, seen on a two-rank server); this one is kept by the HTTP process itself."""
    if samples is None:
        return None
    return sum(s.value for s in samples if dict(s.labels).get("endpoint") not in _NOT_GENERATION)


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _lines_wanted(text: str, wanted: frozenset[str]) -> str:
    """Only the sample lines the daemon reads, before the Prometheus parser sees them: real SGLang's
    /metrics is ~530 lines of histograms under load, and parsing them all cost ~8 ms of CPU a scrape
    (issue 51: the daemon's own cost). A line that is not a sample of a valid metric name is kept, so
    garbage still fails the parse and the scrape is `unavailable`, as before."""
    kept = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted or not _NAME.fullmatch(name):
            kept.append(line)
    return "\n".join(kept) + "\n" if kept else ""


def _wanted_samples(text: str, wanted: frozenset[str]) -> dict[str, list[_Sample]]:
    found: dict[str, list[_Sample]] = {}
    for family in text_string_to_metric_families(_lines_wanted(text, wanted)):
        for sample in family.samples:
            value = float(sample.value)
            if sample.name in wanted and math.isfinite(value):
                labels = tuple(sorted((str(k), str(v)) for k, v in sample.labels.items()))
                found.setdefault(sample.name, []).append(_Sample(sample.name, labels, value))
    return found


def _combine(
    samples: Iterable[_Sample] | None, replicas: frozenset[str] = SGLANG.metrics.replica_labels
) -> float | None:
    """Largest over replica labels (tp_rank, pid), summed over everything else (module docstring)."""
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for s in samples or ():
        key = tuple(kv for kv in s.labels if kv[0] not in replicas)
        groups[key] = max(groups.get(key, s.value), s.value)
    return sum(groups.values()) if groups else None


def _mean(samples: Iterable[_Sample] | None) -> float | None:
    values = [s.value for s in samples or ()]
    return sum(values) / len(values) if values else None


def accept_length_from_server_info(data: object) -> float | None:
    """Mean `avg_spec_accept_length` over `/get_server_info`'s `internal_states[i]`, tolerating any
    shape (older builds put it at the top level); None when absent or 0 (no speculative step yet)."""
    if not isinstance(data, dict):
        return None
    values: list[float] = []
    states = data.get("internal_states")
    if isinstance(states, list):
        found = (_number(s.get("avg_spec_accept_length")) for s in states if isinstance(s, dict))
        values = [v for v in found if v is not None and v > 0]  # 0: no speculative step measured
    if not values:
        top = _number(data.get("avg_spec_accept_length"))
        values = [top] if top is not None and top > 0 else []
    return sum(values) / len(values) if values else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


class ServingProbe:
    """Scrapes the server's `/metrics` with a client timeout and a body cap; never raises. Keeps the
    last speculative counts it read, so an engine that only counts (vLLM) gets an interval's mean."""

    def __init__(
        self,
        base_url: str,
        metrics_path: str,
        timeout_s: float,
        client: httpx.AsyncClient | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        max_bytes: int = MAX_METRICS_BYTES,
        names: MetricNames = SGLANG.metrics,
    ) -> None:
        self.url = join_url(base_url, metrics_path)
        self.names = names
        self._spec: SpecCounts | None = None
        self._timeout_s = timeout_s
        self._client = client or make_client()
        self._owns_client = client is None
        self._monotonic = monotonic
        self._max_bytes = max_bytes

    async def observe(self) -> ServingObservation:
        got = await fetch(self._client, self.url, self._timeout_s, self._max_bytes, self._monotonic)
        at = self._monotonic()
        if got.error:
            return ServingObservation(at=at, available=False, error=got.error)
        if got.status_code == 404:
            return ServingObservation(at=at, available=False, error="metrics not enabled")
        if got.status_code != 200:
            return ServingObservation(at=at, available=False, error=f"HTTP {got.status_code}")
        text = got.body.decode("utf-8", "replace")
        # parsing a few hundred KB takes milliseconds of pure Python: off the event loop
        seen = await asyncio.to_thread(parse_metrics, text, at, self.names, self._spec)
        if seen.spec_counts is not None:
            self._spec = seen.spec_counts
        return seen

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
