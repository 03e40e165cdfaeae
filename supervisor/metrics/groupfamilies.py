"""Metric families for a multi-node group, per node (label `node`), read from the status snapshot
at scrape time (supervisor/metrics/exporter.py yields them with its own). docs/METRICS.md."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from supervisor.policy.lifecycle import SERVING_NAMES
from supervisor.status.snapshot import StatusSnapshot

PREFIX = "sglang_supervisor_"
GROUP_STATUSES = ("ok", "degraded", "incident")


def group_families(s: StatusSnapshot | None) -> Iterator[Metric]:
    if s is None or s.group is None:
        return
    g = s.group
    reachable = GaugeMetricFamily(
        PREFIX + "group_node_reachable",
        "1 when the node's daemon answered the leader's last poll (this node: 1)",
        labels=["node"],
    )
    serving = GaugeMetricFamily(
        PREFIX + "group_node_serving",
        "1 when the node's server is ready or degraded, as its daemon last said",
        labels=["node"],
    )
    unreachable = GaugeMetricFamily(
        PREFIX + "group_node_unreachable_seconds",
        "How long the leader's requests to the node's daemon have failed",
        labels=["node"],
    )
    pid = GaugeMetricFamily(
        PREFIX + "group_node_server_pid", "The node's server main pid (absent: none)", labels=["node"]
    )
    status = GaugeMetricFamily(
        PREFIX + "group_status",
        "The leader's group verdict: 1 for the current one of ok, degraded, incident",
        labels=["status"],
    )
    serves = GaugeMetricFamily(PREFIX + "group_serves", "1 when the group serves (the leader's /readyz)")
    for n in g.nodes:
        label = [str(n.node)]
        reachable.add_metric(label, 1.0 if n.reachable else 0.0)
        serving.add_metric(label, 1.0 if n.state in SERVING_NAMES else 0.0)
        unreachable.add_metric(label, n.unreachable_s)
        if n.pid is not None:
            pid.add_metric(label, float(n.pid))
    for st in GROUP_STATUSES:
        status.add_metric([st], 1.0 if g.status == st else 0.0)
    serves.add_metric([], 1.0 if g.serves else 0.0)
    yield from (reachable, serving, unreachable, pid, status, serves)
