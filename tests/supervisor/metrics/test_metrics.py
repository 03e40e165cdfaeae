"""The exposition: read from the snapshot at scrape time, parseable by Prometheus's own tooling,
and every metric the shipped dashboard and alert rules use exists."""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fake_supervisor import sample_snapshot, sample_starting_snapshot
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.alerting.dispatch import NotifyMetrics
from supervisor.config.alerting import NotifyTarget
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.status.snapshot import StatusSnapshot, ToolCheck

DOCS = Path(__file__).resolve().parents[3] / "docs"
NAME = re.compile(r"\bsglang_supervisor_[a-zA-Z0-9_]+")


def scrape(snap: StatusSnapshot, *, events: bool = True) -> str:
    registry = CollectorRegistry()
    metrics = SupervisorMetrics(registry, lambda: snap)
    NotifyMetrics(registry).declare((NotifyTarget(name="oncall", url="http://127.0.0.1:9/x"),))
    if events:
        metrics.restart("startup_stall")
        metrics.incident("startup_stall", "idle_deadlock")
        metrics.diagnostic(12.5, "written")
        metrics.health(0.8, True)
        metrics.health(30.0, False)
        metrics.ready(61.0)
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, frozenset(labels.items()))]


def test_gauges_follow_the_snapshot() -> None:
    text = scrape(sample_snapshot())
    assert value(text, "sglang_supervisor_state", state="ready") == 1
    assert value(text, "sglang_supervisor_state", state="hung") == 0
    assert value(text, "sglang_supervisor_rung") == 0
    assert value(text, "sglang_supervisor_rung_info", rung="base") == 1
    assert value(text, "sglang_supervisor_rung_info", rung="no-spec") == 0
    assert value(text, "sglang_supervisor_server_up") == 1
    assert value(text, "sglang_supervisor_load_progress_ratio") == 1
    assert value(text, "sglang_supervisor_seconds_since_progress") == 1.5
    assert value(text, "sglang_supervisor_restarts_last_hour") == 1
    assert value(text, "sglang_supervisor_incident_last_timestamp_seconds") == 1735689600.0
    assert value(text, "sglang_supervisor_spec_accept_length") == 3.1
    assert value(text, "sglang_supervisor_running_requests") == 3
    assert value(text, "sglang_supervisor_queued_requests") == 0
    assert value(text, "sglang_supervisor_last_time_to_ready_seconds") == 61
    gpu = {"gpu": "0", "uuid": "GPU-5f1c7d2e-0000-0000-0000-000000000000"}
    assert value(text, "sglang_supervisor_gpu_utilization_ratio", **gpu) == 0.95
    assert value(text, "sglang_supervisor_gpu_memory_used_bytes", **gpu) == 120 * 2**30
    assert value(text, "sglang_supervisor_gpu_memory_total_bytes", **gpu) == 141 * 2**30
    assert value(text, "sglang_supervisor_server_gpu_memory_bytes", **gpu) == 118 * 2**30
    assert value(text, "sglang_supervisor_gpu_probe_up") == 1


def test_event_counters_and_histograms() -> None:
    text = scrape(sample_snapshot())
    assert value(text, "sglang_supervisor_restarts_total", cause="startup_stall") == 1
    assert value(text, "sglang_supervisor_restarts_total", cause="manual") == 0  # every cause pre-declared
    assert value(text, "sglang_supervisor_incidents_total", cause="startup_stall", hang_class="idle_deadlock") == 1
    assert value(text, "sglang_supervisor_diagnostics_total", outcome="written") == 1
    assert value(text, "sglang_supervisor_diagnostics_total", outcome="error") == 0  # every outcome pre-declared
    # Every cause and class pre-declared, so increase() sees the first incident of each.
    assert value(text, "sglang_supervisor_incidents_total", cause="serving_stall", hang_class="busy_spin") == 0
    assert value(text, "sglang_supervisor_incidents_total", cause="exited", hang_class="none") == 0
    assert value(text, "sglang_supervisor_diagnostic_duration_seconds_count") == 1
    assert value(text, "sglang_supervisor_health_checks_total", result="ok") == 1
    assert value(text, "sglang_supervisor_health_checks_total", result="failed") == 1
    assert value(text, "sglang_supervisor_health_latency_seconds_bucket", le="1.0") == 1
    assert value(text, "sglang_supervisor_health_latency_seconds_bucket", le="30.0") == 2
    assert value(text, "sglang_supervisor_time_to_ready_seconds_sum") == 61


def test_starting_snapshot_has_progress_and_omits_unknowns() -> None:
    text = scrape(sample_starting_snapshot(), events=False)
    assert value(text, "sglang_supervisor_state", state="starting") == 1
    assert value(text, "sglang_supervisor_server_up") == 0
    assert abs(value(text, "sglang_supervisor_load_progress_ratio") - 45 / 61) < 1e-9
    names = {name for name, _ in samples(text)}
    assert "sglang_supervisor_spec_accept_length" not in names
    assert "sglang_supervisor_running_requests" not in names
    assert "sglang_supervisor_last_time_to_ready_seconds" not in names


def test_selfcheck_and_build_info() -> None:
    snap = sample_snapshot().model_copy(
        update={
            "version": "9.9.9",
            "selfcheck": (ToolCheck(name="py-spy", ok=True), ToolCheck(name="gdb", ok=False, detail="not found")),
        }
    )
    text = scrape(snap, events=False)
    assert value(text, "sglang_supervisor_selfcheck_ok", tool="py-spy") == 1
    assert value(text, "sglang_supervisor_selfcheck_ok", tool="gdb") == 0
    assert value(text, "sglang_supervisor_build_info", version="9.9.9", python=platform.python_version()) == 1


def test_a_bare_snapshot_scrapes() -> None:
    text = scrape(StatusSnapshot(state="stopped"), events=False)
    assert value(text, "sglang_supervisor_state", state="stopped") == 1
    assert value(text, "sglang_supervisor_gpu_probe_up") == 0
    assert value(text, "sglang_supervisor_load_progress_ratio") == 0


def test_a_failing_snapshot_does_not_fail_the_scrape() -> None:
    def broken() -> StatusSnapshot:
        raise RuntimeError("no snapshot")

    registry = CollectorRegistry()
    SupervisorMetrics(registry, broken).restart("manual")
    text = generate_latest(registry).decode()
    assert value(text, "sglang_supervisor_restarts_total", cause="manual") == 1
    assert "sglang_supervisor_state" not in text


def test_registries_are_independent() -> None:
    a, b = CollectorRegistry(), CollectorRegistry()
    SupervisorMetrics(a, sample_snapshot).restart("manual")
    SupervisorMetrics(b, sample_snapshot)
    assert value(generate_latest(b).decode(), "sglang_supervisor_restarts_total", cause="manual") == 0


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian: apt-get install prometheus)"
)
def test_promtool_accepts_the_exposition() -> None:
    for snap in (sample_snapshot(), sample_starting_snapshot(), StatusSnapshot(state="failed")):
        result = subprocess.run(
            ["promtool", "check", "metrics"], input=scrape(snap), capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


def exposed_names() -> set[str]:
    text = scrape(sample_snapshot())
    names = {name for name, _ in samples(text)}
    families = list(text_string_to_metric_families(text))
    # A labelled counter with no event yet (gpu_xid_total: labels only an Xid gives) shows its
    # HELP and TYPE, not a sample: the family is exposed, under its `_total` name.
    return names | {f.name for f in families} | {f.name + "_total" for f in families if f.type == "counter"}


def _exprs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, item in node.items():
            if key in ("expr", "query") and isinstance(item, str):
                yield item
            else:
                yield from _exprs(item)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def dashboard_exprs() -> list[str]:
    return list(_exprs(json.loads((DOCS / "grafana-dashboard.json").read_text())))


def alert_rules() -> list[dict[str, object]]:
    doc = yaml.safe_load((DOCS / "prometheus-alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_dashboard_uses_only_exposed_metrics() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    used = {name for e in exprs for name in NAME.findall(e)}
    assert used, "the dashboard queries no supervisor metric"
    assert used <= exposed_names(), used - exposed_names()
    titles = json.dumps(json.loads((DOCS / "grafana-dashboard.json").read_text())["panels"]).lower()
    for topic in ("state", "rung", "restarts", "incidents", "progress", "health latency", "gpu", "acceptance"):
        assert topic in titles, topic


def test_alerts_use_only_exposed_metrics() -> None:
    rules = alert_rules()
    names = {str(r["alert"]) for r in rules}
    assert {
        "SGLangServerDown",
        "SGLangSupervisorHung",
        "SGLangSupervisorFailed",
        "SGLangCrashLoop",
        "SGLangSpecRegression",
        "SGLangGpuMemoryHeldWhileDown",
    } <= names
    used = {name for r in rules for name in NAME.findall(str(r["expr"]))}
    assert used <= exposed_names(), used - exposed_names()
    for rule in rules:
        assert "summary" in rule["annotations"]  # type: ignore[operator]
        assert rule["labels"]["severity"] in ("critical", "warning")  # type: ignore[index]


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian: apt-get install prometheus)"
)
def test_promtool_accepts_the_alert_rules() -> None:
    result = subprocess.run(
        ["promtool", "check", "rules", str(DOCS / "prometheus-alerts.yml")], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_metrics_doc_lists_every_family_and_no_other() -> None:
    from groupsample import GROUP  # a multi-node group's families appear only with [group]

    text = scrape(sample_snapshot().model_copy(update={"group": GROUP}))
    families = {
        f.name + ("_total" if f.type == "counter" else "")
        for f in text_string_to_metric_families(text)
        if not f.name.endswith("_created")  # the client library's companions of counters and histograms
        and f.name.startswith("sglang_supervisor_")  # process_*: the client library's, documented apart
    }
    documented = set(re.findall(r"^\| `(sglang_supervisor_[a-z0-9_]+)`", (DOCS / "METRICS.md").read_text(), re.M))
    assert families == documented


def test_the_daemons_own_process_metrics_and_the_last_incident() -> None:
    text = scrape(sample_snapshot())
    names = {f.name for f in text_string_to_metric_families(text)}
    # Linux: the client library's process collector reads /proc/self
    assert {"process_resident_memory_bytes", "process_cpu_seconds", "process_open_fds"} <= names
    assert value(text, "process_resident_memory_bytes") > 0
    documented = set(re.findall(r"^\| `(process_[a-z_]+)`", (DOCS / "METRICS.md").read_text(), re.M))
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"} <= documented
    snap = sample_snapshot()
    assert snap.last_incident is not None
    inc = snap.last_incident
    labels = {"id": inc.id, "cause": inc.cause, "hang_class": inc.hang_class or "none"}
    assert value(text, "sglang_supervisor_last_incident_info", **labels) == 1.0
    if snap.serving.spec_accept_length is not None:
        assert value(text, "sglang_supervisor_spec_accept_length_tokens") == snap.serving.spec_accept_length
        assert value(text, "sglang_supervisor_spec_accept_length") == snap.serving.spec_accept_length
    assert "DEPRECATED" in text


def test_no_incident_no_info_series() -> None:
    text = scrape(StatusSnapshot(state="ready"))
    assert "sglang_supervisor_last_incident_info{" not in text
