"""Per-node metrics of a multi-node group and the CLI's group rows, from a leader's snapshot."""

from __future__ import annotations

from groupsample import GROUP
from prometheus_client import CollectorRegistry, generate_latest

from supervisor.client.format import format_status
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.status.snapshot import StatusSnapshot


def scrape(snap: StatusSnapshot) -> str:
    registry = CollectorRegistry()
    SupervisorMetrics(registry, lambda: snap)
    return generate_latest(registry).decode()


def test_every_node_has_its_series() -> None:
    text = scrape(StatusSnapshot(state="degraded", group=GROUP))
    assert 'sglang_supervisor_group_node_reachable{node="2"} 0.0' in text
    assert 'sglang_supervisor_group_node_serving{node="1"} 1.0' in text
    assert 'sglang_supervisor_group_node_serving{node="2"} 0.0' in text
    assert 'sglang_supervisor_group_node_unreachable_seconds{node="2"} 12.0' in text
    assert 'sglang_supervisor_group_node_server_pid{node="1"} 200.0' in text
    assert 'sglang_supervisor_group_node_server_pid{node="2"}' not in text  # no pid known: no series
    assert 'sglang_supervisor_group_status{status="degraded"} 1.0' in text
    assert 'sglang_supervisor_group_status{status="ok"} 0.0' in text
    assert "sglang_supervisor_group_serves 1.0" in text


def test_one_node_has_no_group_series() -> None:
    assert "sglang_supervisor_group_" not in scrape(StatusSnapshot(state="ready"))


def test_the_cli_shows_each_node() -> None:
    out = format_status(StatusSnapshot(state="degraded", group=GROUP).model_dump(mode="json"))
    assert "node 0 of 3 (leader), restart by daemon; group degraded and serving (node 2 daemon unreachable" in out
    assert "node 1 h1:8900: ready, pid 200, rung base, stopped (T): 201" in out
    assert "node 2 h2:8900: unreachable for 12 s (connection refused)" in out
