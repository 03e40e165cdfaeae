"""Prometheus metrics: gauges read from the status snapshot at scrape time, counters and
histograms fed by the supervisor's events. docs/METRICS.md describes every family.

Everything is registered on the `CollectorRegistry` passed in, so each test uses a fresh one.
Per-GPU series carry `gpu` (the NVML index) and `uuid` labels, as DCGM's exporter does, so the
two can be joined in PromQL.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.metrics.busyfamilies import busy_families
from supervisor.metrics.groupfamilies import group_families
from supervisor.policy.lifecycle import SERVING, State
from supervisor.status.causes import CAUSES, HANG_CLASSES
from supervisor.status.launchviews import MILESTONES, OUTAGE_PARTS
from supervisor.status.snapshot import StatusSnapshot

PREFIX = "sglang_supervisor_"
# SGLang's /health takes about a second when healthy; the watchdog gives up at 30 s by default.
HEALTH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0)
# py-spy over a tree of a dozen processes takes seconds; gdb on a hung tree up to a minute or two.
DIAGNOSTIC_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Loading a multi-hundred-GB model takes minutes; anything past an hour has hit the backstop.
READY_BUCKETS = (5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 3600.0)
# A phase of a launch: from a fraction of a second (a warm cache) to the 10-minute silent compiles of
# a large model; an outage: seconds (a crash, relaunched at once) to the backstop.
PHASE_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
OUTAGE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0)
GPU_LABELS = ("gpu", "uuid")
# Every label value a counter can take is declared at 0 up front, so `increase()` sees the first
# event (a series that appears at 1 has no earlier sample to increase from).
INCIDENT_CLASSES = (*HANG_CLASSES, "none")  # "none": nothing was classified (e.g. the server exited)
DIAGNOSTIC_OUTCOMES = ("written", "write_failed", "error")
LAUNCH_REFUSALS = ("port_busy", "gpu_held")
INCIDENT_LABELS = ("id", "cause", "hang_class")

log = structlog.get_logger(__name__)


def _epoch(iso: str) -> float | None:
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class _SnapshotCollector(Collector):
    """The gauges: one read of the snapshot per scrape, so a scrape is one consistent picture."""

    def __init__(self, snapshot: Callable[[], StatusSnapshot], last_ready: Callable[[], float | None]) -> None:
        self._snapshot = snapshot
        self._last_ready = last_ready

    def describe(self) -> Iterable[Metric]:
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        try:
            snap = self._snapshot()
        except Exception:  # a scrape must not fail because the snapshot did
            log.exception("metrics_snapshot_failed")
            return []
        return list(self._families(snap))

    def _families(self, s: StatusSnapshot | None) -> Iterator[Metric]:
        def gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))

        state = gauge("state", "1 for the supervisor's current state, 0 for the others", ["state"])
        rung = gauge("rung", "Index in the ladder of the rung now in use (0 = base configuration)")
        rung_info = gauge("rung_info", "1 for the rung now in use, 0 for the other rungs of the ladder", ["rung"])
        up = gauge("server_up", "1 while the server is serving (state ready or degraded), else 0")
        fallback = gauge(
            "serving_on_fallback", "1 while the server serves on a fallback rung (not the preferred, rung 0), else 0"
        )
        ttr = gauge("last_time_to_ready_seconds", "Launch-to-ready time of the current or last server")
        load = gauge("load_progress_ratio", "Start-up progress 0..1 where the log shows it; 1 while serving")
        since = gauge("seconds_since_progress", "Seconds since any progress channel last moved")
        hour = gauge("restarts_last_hour", "Relaunches within the last hour (the restart budget's window)")
        last_inc = gauge("incident_last_timestamp_seconds", "Unix time of the last incident")
        spec = gauge("spec_accept_length", "DEPRECATED (removed in the next release): use spec_accept_length_tokens")
        spec_tokens = gauge(
            "spec_accept_length_tokens", "Speculative decoding's mean accepted length in tokens per step, from SGLang"
        )
        inc_info = gauge(
            "last_incident_info", "Always 1; the last incident's id, cause and hang class", INCIDENT_LABELS
        )
        tokens = gauge(
            "generation_tokens_per_second", "Tokens the server generates per second, from its counters or its log"
        )
        running = gauge("running_requests", "Requests the server is running, scraped from SGLang")
        queued = gauge("queued_requests", "Requests waiting in the server's queue, scraped from SGLang")
        gpu_ok = gauge("gpu_probe_up", "1 when NVML answered on the last poll, else 0")
        util = gauge("gpu_utilization_ratio", "GPU utilisation 0..1", GPU_LABELS)
        used = gauge("gpu_memory_used_bytes", "GPU memory in use by anything", GPU_LABELS)
        total = gauge("gpu_memory_total_bytes", "GPU memory installed", GPU_LABELS)
        held = gauge("server_gpu_memory_bytes", "GPU memory held by the supervised process tree", GPU_LABELS)
        build = gauge("build_info", "Always 1; the daemon's version and Python as labels", ["version", "python"])
        tools = gauge("selfcheck_ok", "1 when the start-up self-check found the evidence tool usable, else 0", ["tool"])
        if s is not None:
            build.add_metric([s.version or "unknown", platform.python_version()], 1.0)
            for check in s.selfcheck:
                tools.add_metric([check.name], 1.0 if check.ok else 0.0)
            for st in State:
                state.add_metric([st.value], 1.0 if s.state == st.value else 0.0)
            if s.rung_index is not None:
                rung.add_metric([], float(s.rung_index))
            for name in s.ladder or ((s.rung,) if s.rung else ()):
                rung_info.add_metric([name], 1.0 if name == s.rung else 0.0)
            serving = s.state in {x.value for x in SERVING}
            up.add_metric([], 1.0 if serving else 0.0)
            fallback.add_metric([], 1.0 if serving and (s.rung_index or 0) > 0 else 0.0)
            ready_s = s.time_to_ready_s if s.time_to_ready_s is not None else self._last_ready()
            if ready_s is not None:
                ttr.add_metric([], ready_s)
            load.add_metric([], s.progress.fraction if s.progress else (1.0 if serving else 0.0))
            if s.last_progress_s is not None:
                since.add_metric([], s.last_progress_s)
            hour.add_metric([], float(s.restarts_last_hour))
            at = _epoch(s.last_incident.at) if s.last_incident else None
            if at is not None:
                last_inc.add_metric([], at)
            if s.last_incident is not None:
                inc = s.last_incident
                inc_info.add_metric([inc.id, inc.cause, inc.hang_class or "none"], 1.0)
            if s.serving.spec_accept_length is not None:
                spec_tokens.add_metric([], s.serving.spec_accept_length)
            if s.serving.token_rate is not None:
                tokens.add_metric([], s.serving.token_rate)
            for family, value in (
                (spec, s.serving.spec_accept_length),
                (running, s.serving.running_reqs),
                (queued, s.serving.queue_reqs),
            ):
                if value is not None:
                    family.add_metric([], value)
            gpu_ok.add_metric([], 1.0 if s.gpu.status == "ok" else 0.0)
            for d in s.gpu.devices:
                labels = [str(d.index), d.uuid]
                util.add_metric(labels, d.util_percent / 100.0)
                used.add_metric(labels, float(d.mem_used_bytes))
                total.add_metric(labels, float(d.mem_total_bytes))
                held.add_metric(labels, float(d.tree_mem_bytes))
        yield from (state, rung, rung_info, up, ttr, load, since, hour, last_inc, spec, running, queued)
        yield from (gpu_ok, util, used, total, held, build, tools, spec_tokens, inc_info, tokens, fallback)
        yield from busy_families(s)
        yield from group_families(s)


class SupervisorMetrics:
    """The daemon's metrics on `registry`; the daemon calls the event methods as things happen."""

    def __init__(self, registry: CollectorRegistry, snapshot: Callable[[], StatusSnapshot]) -> None:
        self._last_ready: float | None = None
        self._restarts = Counter(
            PREFIX + "restarts", "Server relaunches, by the incident cause", ["cause"], registry=registry
        )
        for cause in CAUSES:
            self._restarts.labels(cause=cause)
        self._incidents = Counter(
            PREFIX + "incidents",
            "Incidents, by cause and the hang class the evidence showed",
            ["cause", "hang_class"],
            registry=registry,
        )
        for cause in CAUSES:
            for hang_class in INCIDENT_CLASSES:
                self._incidents.labels(cause=cause, hang_class=hang_class)
        self._health_latency = Histogram(
            PREFIX + "health_latency_seconds",
            "Latency of the server's health endpoint, successful or not",
            buckets=HEALTH_BUCKETS,
            registry=registry,
        )
        self._health_checks = Counter(
            PREFIX + "health_checks", "Health checks of the server, by result", ["result"], registry=registry
        )
        for result in ("ok", "failed"):
            self._health_checks.labels(result=result)
        self._diagnostics = Counter(
            PREFIX + "diagnostics", "Diagnostic captures, by outcome", ["outcome"], registry=registry
        )
        for outcome in DIAGNOSTIC_OUTCOMES:
            self._diagnostics.labels(outcome=outcome)
        self._diagnostic_duration = Histogram(
            PREFIX + "diagnostic_duration_seconds",
            "Wall time of a diagnostic capture",
            buckets=DIAGNOSTIC_BUCKETS,
            registry=registry,
        )
        self._time_to_ready = Histogram(
            PREFIX + "time_to_ready_seconds",
            "Launch-to-ready time of each server start",
            buckets=READY_BUCKETS,
            registry=registry,
        )
        self._loop_errors = Counter(
            PREFIX + "loop_errors",
            "Exceptions the supervisor loop caught and survived, by exception type",
            ["type"],
            registry=registry,
        )
        self._write_errors = Counter(
            PREFIX + "write_errors",
            "Failed writes of the daemon's own files (journal, server log, state, bundle), by file",
            ["file"],
            registry=registry,
        )
        for what in ("journal", "server_log", "state", "bundle"):
            self._write_errors.labels(file=what)
        self._keeper_replaced = Counter(
            PREFIX + "log_keeper_replaced",
            "Log keepers found dead (killed, crashed) and replaced on the same pipe, without a server restart",
            registry=registry,
        )
        self._launches_refused = Counter(
            PREFIX + "launches_refused",
            "Launches not made, by reason (port_busy: the server port was held by another process;"
            " gpu_held: processes outside the server left less GPU memory free than the rung needs,"
            " or [slate] gpu_strangers is wait/refuse)",
            ["reason"],
            registry=registry,
        )
        for reason in LAUNCH_REFUSALS:
            self._launches_refused.labels(reason=reason)
        self._takeover = Histogram(
            PREFIX + "adoption_takeover_seconds",
            "Adoption to ready of a server an earlier daemon started (not a load: no model was reloaded)",
            buckets=(0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0),
            registry=registry,
        )
        self._xids = Counter(
            PREFIX + "gpu_xid",
            "GPU faults (Xid critical errors) NVML reported, by GPU, Xid and what they need",
            ["gpu", "uuid", "xid", "action"],
            registry=registry,
        )
        # issue 36: each launch's phases (supervisor/status/launchviews.py) and each outage in its parts
        self._launch_phase = Histogram(
            PREFIX + "launch_phase_seconds",
            "Time from one launch milestone to the next (the phase is named by the milestone it starts at)",
            ["phase"],
            buckets=PHASE_BUCKETS,
            registry=registry,
        )
        self._outage = Histogram(
            PREFIX + "outage_seconds",
            "Incident to serving again (part=total) and its parts: detection, evidence, stop_release, backoff,"
            " relaunch; part=daemon is the daemon's own share (verdict to the relaunch's spawn)",
            ["part"],
            buckets=OUTAGE_BUCKETS,
            registry=registry,
        )
        for part in (*OUTAGE_PARTS, "total", "daemon"):
            self._outage.labels(part=part)
        registry.register(_SnapshotCollector(snapshot, lambda: self._last_ready))
        # The daemon's own RSS, CPU seconds, open descriptors (process_*, Prometheus's standard names).
        ProcessCollector(registry=registry)

    def keeper_replaced(self) -> None:
        self._keeper_replaced.inc()

    def launch_refused(self, reason: str) -> None:
        self._launches_refused.labels(reason=reason).inc()

    def loop_error(self, kind: str) -> None:
        self._loop_errors.labels(type=kind).inc()

    def write_error(self, what: str, n: int = 1) -> None:
        if n > 0:
            self._write_errors.labels(file=what).inc(n)

    def xid(self, gpu: int, uuid: str, xid: int, action: str) -> None:
        self._xids.labels(gpu=str(gpu), uuid=uuid, xid=str(xid), action=action).inc()

    def restart(self, cause: str) -> None:
        self._restarts.labels(cause=cause).inc()

    def incident(self, cause: str, hang_class: str) -> None:
        self._incidents.labels(cause=cause, hang_class=hang_class or "unknown").inc()

    def diagnostic(self, duration_s: float, outcome: str) -> None:
        self._diagnostics.labels(outcome=outcome).inc()
        self._diagnostic_duration.observe(max(0.0, duration_s))

    def health(self, latency_s: float, ok: bool) -> None:
        self._health_checks.labels(result="ok" if ok else "failed").inc()
        self._health_latency.observe(max(0.0, latency_s))

    def takeover(self, seconds: float) -> None:
        self._takeover.observe(max(0.0, seconds))

    def launch_phase(self, phase: str, seconds: float) -> None:
        if phase in MILESTONES:
            self._launch_phase.labels(phase=phase).observe(max(0.0, seconds))

    def outage(self, part: str, seconds: float) -> None:
        self._outage.labels(part=part).observe(max(0.0, seconds))

    def ready(self, time_to_ready_s: float) -> None:
        self._last_ready = max(0.0, time_to_ready_s)
        self._time_to_ready.observe(self._last_ready)
