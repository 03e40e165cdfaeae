"""The group recovers as one (issue 54), through running daemons: one real daemon per node, each
with its own state directory, API port and simulated node, on one machine (docs/MULTINODE.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from groupdaemons import Load, cut_off, group_of, group_ready, twin_of

from supervisor.common.waiting import wait_for
from supervisor.policy.recovery import GROUP_SAME_RUNG

pytestmark = pytest.mark.integration


def test_a_start_up_hang_on_every_node_steps_down_in_two_incidents(nodes_of) -> None:  # type: ignore[no-untyped-def]
    """Both nodes' `base` deadlocks after the load; `no-cuda-graph` fixes it. The hang is the
    rung's: one retry (retries_per_rung 1), then a step down, never "a node was away"."""
    unless = {"SGLANG_SIM_UNLESS": "disable-cuda-graph"}
    leader, worker = nodes_of(
        scenarios={0: "deadlock_after_load", 1: "deadlock_after_load"},
        env={0: unless, 1: unless},
        fallback=[{"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}],
    )
    st = leader.wait(lambda s: s["rung"] == "no-cuda-graph" and group_ready(s), 180, "the group ready on the fallback")
    decisions = leader.events("ladder_decision")
    assert not [d for d in decisions if d["reason"].startswith(GROUP_SAME_RUNG)], decisions
    assert st["incidents"] <= 2, decisions
    assert worker.status()["rung"] == "no-cuda-graph"  # type: ignore[index]


def test_node_0s_readyz_is_503_while_its_own_server_fails_and_the_group_waits(nodes_of) -> None:  # type: ignore[no-untyped-def]
    """Node 1 frozen whole (its daemon and its ranks): node 0's server hangs on the collective that
    waits for it, and the leader holds that incident for absent_wait_s. Through the wait node 0 tells
    the truth: `/readyz` 503, not 200 while its own server fails."""
    leader, worker = nodes_of(group={"absent_wait_s": 45.0})
    leader.wait(group_ready, 60, "the group ready")
    with Load(leader.settings.server.port):
        leader.wait(lambda s: (s["serving"]["running_reqs"] or 0) > 0, 20, "requests running")
        with cut_off(worker):
            leader.wait(lambda s: "waiting for node 1" in s["reason"], 60, "node 0 holding its incident for node 1")
            answers = []
            for _ in range(5):
                answers.append(leader.get("/readyz", auth=False).status_code)
                time.sleep(0.5)
            st = leader.status()
            assert st is not None and "waiting for node 1" in st["reason"], st["reason"]  # still the wait
            assert answers == [503] * 5, (answers, st["state"], st["reason"])
            assert st["group"]["serves"] is False
    leader.wait(group_ready, 120, "the group ready again")
    assert leader.get("/readyz", auth=False).status_code == 200


def test_a_second_daemon_on_one_node_rank_is_refused_through_the_groups_relaunch(tmp_path, nodes_of) -> None:  # type: ignore[no-untyped-def]
    """The leader drops every report at a group stop or launch; the node_rank's identity (its state
    directory) outlives that, so the twin asking all through the relaunch is refused every time,
    named beside the daemon that holds the rank, and launches nothing."""
    leader, worker = nodes_of()
    leader.wait(group_ready, 90, "the group ready")
    twin = twin_of(worker, tmp_path / "twin")
    try:
        twin.start()
        wait_for(twin.events, lambda evs: any(e["event"] == "group_launch_held" for e in evs), 60, what="twin held")
        old = leader.status()["pid"], worker.status()["pid"]  # type: ignore[index]
        assert leader.post("/restart", {"reason": "test"}).status_code == 202  # the group stops and launches
        leader.wait(lambda s: s["pid"] != old[0] and group_ready(s), 90, "the group relaunched and ready")
        time.sleep(3)  # the twin keeps asking
        assert not twin.events("server_launched"), twin.events("server_launched")
        st = twin.status()
        assert st is not None and st["pid"] is None
        assert f"node_rank 1 is already the daemon at {worker.address}" in st["reason"], st["reason"]
        refused = leader.events("group_join_refused")
        assert refused and all(f"127.0.0.1:{twin.settings.api.port}" in e["reason"] for e in refused), refused
        assert worker.status()["pid"] != old[1]  # type: ignore[index]  # the holder relaunched with the group
    finally:
        twin.cleanup()


def test_a_members_crash_loop_is_named_on_that_member_every_time(nodes_of) -> None:  # type: ignore[no-untyped-def]
    """Node 1's server crashes at every load; node 0 is healthy. Each incident of the group names
    node 1 (node 0's server breaking on the lost peer first is not node 0's fault), and the loop
    is bounded: the ladder runs out and the group is `failed`."""
    leader, _ = nodes_of(
        scenarios={1: "crash_on_load"},
        fallback=[{"name": "second", "args": {"disable-cuda-graph": True}}],
    )
    st = leader.wait(lambda s: s["state"] == "failed", 150, "the group failed after the ladder")
    incidents = leader.events("incident")
    assert len(incidents) >= 2, incidents
    blamed = [(i["cause"], i["detail"][:200]) for i in incidents if not i["detail"].startswith("node 1:")]
    assert not blamed, blamed
    assert st["incidents"] == len(incidents)


@pytest.mark.timeout(300)
def test_three_nodes_one_late_is_waited_for_named_and_costs_no_ladder_step(tmp_path: Path) -> None:
    """Node 0 and node 1 up, node 2 starts 35 s later, absent_wait_s 20: the present member's stall
    at the rendezvous is held for node 2, named; past the wait the group relaunches on its rung (no
    retry is spent: a ladder-judged incident would step down at once here), and serves on `base`."""
    nodes = group_of(
        tmp_path,
        3,
        tp=3,
        group={"absent_wait_s": 20.0},
        fallback=[{"name": "second", "args": {"disable-cuda-graph": True}}],
        restart={"retries_per_rung": 0},
    )
    leader, _, late = nodes
    try:
        nodes[0].start()
        nodes[1].start()
        time.sleep(35)
        late.start()
        st = leader.wait(group_ready, 150, "the group of three ready")
        told = [
            (e["event"], e.get("node"), e.get("reason") or e.get("detail"))
            for e in leader.events()
            if e["event"] in ("incident", "ladder_decision", "group_waiting", "group_incident")
        ]
        assert st["rung"] == "base", "\n".join(map(str, told))
        waiting = leader.events("group_waiting")
        assert waiting and all(w["node"] == 2 for w in waiting), waiting
        for d in leader.events("ladder_decision"):
            assert d["rung"] == 0 and d["reason"].startswith(f"{GROUP_SAME_RUNG}: node 2 was "), d
        for i in leader.events("incident"):
            assert "node 2" in i["detail"], i
    finally:
        for n in reversed(nodes):
            n.cleanup()


def test_a_partition_that_heals_within_the_wait_is_named_and_relaunches_nothing(nodes_of) -> None:  # type: ignore[no-untyped-def]
    """Node 1 cut off whole for 15 s (its daemon and its ranks frozen: nothing of it answers) under
    load, absent_wait_s 45: the leader names the partition and waits; once it heals node 0's server
    recovers on its own and nothing is relaunched, nor the ladder moved."""
    leader, worker = nodes_of(
        group={"absent_wait_s": 45.0},
        fallback=[{"name": "second", "args": {"disable-cuda-graph": True}}],
        restart={"retries_per_rung": 0},
    )
    leader.wait(group_ready, 60, "the group ready")
    wst = worker.status()
    assert wst is not None
    with Load(leader.settings.server.port):
        leader.wait(lambda s: (s["serving"]["running_reqs"] or 0) > 0, 20, "requests running")
        with cut_off(worker):
            leader.wait(lambda s: "partitioned" in s["reason"], 60, "node 0 naming the partition")
            time.sleep(5)
    st = leader.wait(lambda s: group_ready(s) and s["group"]["status"] == "ok", 60, "the group whole again")
    waiting = leader.events("group_waiting")
    assert waiting and waiting[0]["condition"] == "partition", waiting
    assert st["rung"] == "base" and not leader.events("ladder_decision"), leader.events("ladder_decision")
    assert st["incidents"] == 0 and worker.status()["pid"] == wst["pid"]  # type: ignore[index]


@pytest.mark.timeout(300)
def test_a_partition_longer_than_the_wait_relaunches_on_the_rung_names_the_node_and_replaces_its_stale_server(  # type: ignore[no-untyped-def]
    nodes_of,
) -> None:
    """Node 1 cut off whole for longer than absent_wait_s under load: past the wait the group is
    relaunched on its rung, the decision names node 1's partition (not "a node was away", not node
    0), no retry is spent (retries_per_rung 0: a judged incident would step down at once), and once
    the partition heals node 1's stale server, which missed the group's stop, is replaced."""
    leader, worker = nodes_of(
        group={"absent_wait_s": 12.0},
        fallback=[{"name": "second", "args": {"disable-cuda-graph": True}}],
        restart={"retries_per_rung": 0},
    )
    leader.wait(group_ready, 60, "the group ready")
    wst = worker.status()
    assert wst is not None
    with Load(leader.settings.server.port):
        leader.wait(lambda s: (s["serving"]["running_reqs"] or 0) > 0, 20, "requests running")
        with cut_off(worker):
            leader.wait(lambda s: "partitioned" in s["reason"], 60, "node 0 naming the partition")
            relaunched = lambda evs: any(e["event"] == "ladder_decision" for e in evs)  # noqa: E731
            wait_for(leader.events, relaunched, 90, what="the relaunch")
    st = leader.wait(
        lambda s: group_ready(s) and s["group"]["status"] == "ok", 150, "the group whole again after the partition"
    )
    decisions = leader.events("ladder_decision")
    assert decisions and all(d["rung"] == 0 for d in decisions), decisions
    assert decisions[0]["reason"].startswith(f"{GROUP_SAME_RUNG}: node 1 was partitioned ("), decisions[0]
    assert st["rung"] == "base" and worker.status()["rung"] == "base"  # type: ignore[index]
    assert worker.status()["pid"] != wst["pid"]  # type: ignore[index]  # the stale server replaced
    for i in leader.events("incident"):
        assert "node 1" in i["detail"], i  # the partition named, not node 0's own fault
