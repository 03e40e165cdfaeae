"""The owner with a group's peers (GroupPeers): a worker does no token scrape and no self-promotion;
the leader and a single node (NoPeers) keep their settings."""

from __future__ import annotations

from pathlib import Path

from fakeclock import FakeClock
from prometheus_client import CollectorRegistry

from probes.gpu import GpuProbe
from supervisor.config.settings import Settings, settings_from_mapping
from supervisor.daemon.owner import Owner
from supervisor.group.members import group_peers, make_runtime
from supervisor.group.peers import NoPeers, Peers
from supervisor.metrics.exporter import SupervisorMetrics


def settings(tmp_path: Path, group: dict[str, object] | None) -> Settings:
    data: dict[str, object] = {
        "server": {"command": ["sglang-server"], "args": {"tp-size": 2, "enable-metrics": True}},
        "restart": {"promote_after_s": 600},
        "paths": {"state_dir": str(tmp_path / "state")},
    }
    if group is not None:
        secret = tmp_path / "group-secret"
        secret.write_text("owner-group-test-secret-1234\n")
        secret.chmod(0o600)
        data["group"] = {**group, "secret_file": str(secret)}
    return settings_from_mapping(data)


def build(s: Settings) -> Owner:
    """As the composition root builds it: GroupPeers from [group], else NoPeers."""
    clock = FakeClock()
    runtime = make_runtime(s, clock.monotonic)
    peers: Peers = group_peers(runtime) if runtime is not None else NoPeers()
    return Owner(
        s,
        clock=clock,
        metrics=lambda snap: SupervisorMetrics(CollectorRegistry(), snap),
        gpu=GpuProbe(None),
        env={},
        peers=peers,
    )


async def test_a_worker_scrapes_no_tokens_and_never_promotes_itself(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    sup = build(settings(tmp_path, {"nnodes": 2, "node_rank": 1, "leader": "h0:8900"}))
    # No log line from here: the owner's module logger must first be used under the tests that capture it.
    monkeypatch.setattr(sup, "record", lambda *a, **kw: None)
    assert sup._metrics_on == (False,)
    assert sup.settings.restart.promote_after_s == 0.0
    sup.settings = settings(tmp_path, {"nnodes": 2, "node_rank": 1, "leader": "h0:8900"})  # as a reload sets it
    assert sup._metrics_on == (False,) and sup.settings.restart.promote_after_s == 0.0


def test_the_leader_and_a_single_node_keep_their_settings(tmp_path: Path) -> None:
    for group in ({"nnodes": 2, "node_rank": 0, "members": ["h1:8900"]}, None):
        sup = build(settings(tmp_path, group))
        assert sup._metrics_on == (True,) and sup.settings.restart.promote_after_s == 600
        assert (sup.snapshot().group is None) == (group is None)  # a group's part of /status, from its peers
