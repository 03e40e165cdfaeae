"""Issue 34 through real daemons: one rung for the group (a member asks its leader before it
launches; one that cannot reach it does not launch), one config (a differing member or a second
daemon on one node_rank is refused by name, and `check-config --group` asks the running leader),
and LWS recreations that start on the rung decided before the exit."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time

import pytest
from groupdaemons import TOKEN, Node, group_of, group_ready, ready, twin_of

from supervisor.common.waiting import wait_for
from supervisor.config.render import dump_toml

pytestmark = pytest.mark.integration


def held(node: Node, words: str, timeout: float = 60) -> list[dict]:  # type: ignore[type-arg]
    """The node's `group_launch_held` events once one says `words`."""
    return wait_for(
        lambda: node.events("group_launch_held"),
        lambda evs: any(words in e.get("reason", "") for e in evs),
        timeout,
        what=f"node {node.rank} holding its launch ({words})",
    )


def check_group(node: Node) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "supervisor", "check-config", "--no-sglang", "--group", "--config", str(node.config)]
    env = {**os.environ, "SGLANG_SUPERVISOR_TOKEN": TOKEN}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_a_member_with_another_config_is_refused_naming_the_keys_and_launches_nothing(tmp_path, made) -> None:  # type: ignore[no-untyped-def]
    leader, worker = group_of(
        tmp_path,
        fallback=[{"name": "second", "args": {"disable-custom-all-reduce": True}}],
        node_args={1: {"tp-size": 4}},
        # Node 0 waits at the rendezvous for node 1; the group's relaunch comes below, when asked,
        # not when the wait for node 1 runs out (at whatever point of the test a loaded machine reaches).
        group={"absent_wait_s": 600.0},
    )
    made.extend((leader, worker))
    leader.start()
    leader.wait(lambda s: s["pid"] is not None, 60, "node 0 launched")
    verdict = check_group(worker)  # before node 1 starts: the running leader is asked
    assert verdict.returncode == 1, verdict.stdout + verdict.stderr
    assert "refused by the leader" in verdict.stderr and "tp-size (leader 2, this node 4)" in verdict.stderr
    worker.start()
    evs = held(worker, "tp-size (leader 2, this node 4)")
    assert "rung.base" in evs[-1]["reason"]  # the command line differs too, and is named
    st = worker.status()
    assert st is not None and st["pid"] is None and st["state"] == "restarting"  # nothing launched
    refused = leader.events("group_join_refused")
    assert refused and any("tp-size" in d for d in refused[-1]["differs"])
    time.sleep(3)  # asked again each poll, journalled once (on a change of the reason only)
    # A loaded machine may make one ask time out ("cannot be asked (ReadTimeout)"), a change of reason
    # journalled with the refusal after it; the same reason twice in a row is never journalled.
    reasons = [e["reason"] for e in worker.events("group_launch_held")]
    assert all(a != b for a, b in itertools.pairwise(reasons)), reasons
    assert len(leader.events("group_join_refused")) == 1
    # The group's relaunch stops node 1 and asks it to launch node 0's rung: a launch the leader asks
    # for does not accept a config it refused; node 1 asks, is refused again, and launches nothing.
    assert leader.post("/restart", {"reason": "test"}).status_code == 202
    wait_for(
        lambda: worker.events("command"),
        lambda cmds: any(c["kind"] == "start" and c["source"] == "group" for c in cmds),
        60,
        what="the leader's launch reaching node 1",
    )
    wait_for(
        lambda: worker.events("group_launch_held"),
        lambda e: len(e) > len(evs) and "tp-size (leader 2, this node 4)" in e[-1]["reason"],
        30,
        what="node 1 holding the leader's launch",
    )
    st = worker.wait(lambda s: s["state"] == "restarting", 30, "node 1 held")
    assert st["pid"] is None and not worker.events("server_launched")


def test_check_config_group_agrees_with_a_matching_node_and_names_a_differing_rung(tmp_path, made) -> None:  # type: ignore[no-untyped-def]
    leader, worker = group_of(tmp_path, fallback=[{"name": "second", "args": {"disable-custom-all-reduce": True}}])
    made.extend((leader, worker))
    for n in (leader, worker):
        n.start()
    leader.wait(group_ready, 90, "the group ready")
    ok = check_group(worker)
    assert ok.returncode == 0 and "agrees" in ok.stdout, ok.stdout + ok.stderr
    # Same rung names, other arguments: named by rung.
    s = worker.settings
    other = s.model_copy(
        update={"fallback": (s.fallback[0].model_copy(update={"args": {"disable-radix-cache": True}}),)}
    )
    alt = tmp_path / "other.toml"
    alt.write_text(dump_toml(other))
    probe = Node(1, other, alt, tmp_path / "probe.log")
    bad = check_group(probe)
    assert bad.returncode == 1 and "rung.second (leader" in bad.stderr, bad.stdout + bad.stderr
    assert not leader.events("group_join_refused")  # an ask, not a join: nothing recorded


def test_two_daemons_claiming_one_node_rank_the_second_is_refused_by_name(tmp_path, made) -> None:  # type: ignore[no-untyped-def]
    leader, worker = group_of(tmp_path)
    made.extend((leader, worker))
    for n in (leader, worker):
        n.start()
    leader.wait(group_ready, 90, "the group ready")
    twin = twin_of(worker, tmp_path / "twin")
    made.append(twin)
    twin.start()
    held(twin, f"node_rank 1 is already the daemon at {worker.address}")
    assert twin.status()["pid"] is None  # type: ignore[index]
    st = leader.status()
    assert st is not None and st["incidents"] == 0 and st["restarts"] == 0 and group_ready(st)


def test_a_worker_started_before_its_leader_waits_and_launches_the_leaders_rung(tmp_path, made) -> None:  # type: ignore[no-untyped-def]
    leader, worker = group_of(tmp_path)
    made.extend((leader, worker))
    worker.start()
    held(worker, "cannot be asked")
    time.sleep(2)
    st = worker.status()
    assert st is not None and st["pid"] is None and not worker.events("server_launched")
    leader.start()
    st = leader.wait(group_ready, 90, "the group ready")
    assert st["incidents"] == 0 and st["restarts"] == 0
    assert worker.status()["rung"] == "base"  # type: ignore[index]
    assert any(e.get("verdict") == "launch" for e in leader.events("group_join"))


def test_lws_recreation_starts_every_node_on_the_rung_decided_before_the_exit(tmp_path, made) -> None:  # type: ignore[no-untyped-def]
    # Node 1's `base` hangs after the load (`second` does not): a rung that never served, judged by
    # the ladder (a rung that served would keep its standing, issue 49), one step down.
    leader, worker = group_of(
        tmp_path,
        group={"restart": "lws"},
        scenarios={1: "deadlock_after_load"},
        env={1: {"SGLANG_SIM_UNLESS": "disable-custom-all-reduce"}},
        fallback=[{"name": "second", "args": {"disable-custom-all-reduce": True}}],
        restart={"retries_per_rung": 0},
    )
    made.extend((leader, worker))
    for n in (leader, worker):
        n.start()
    assert leader.proc is not None
    assert leader.proc.wait(90) == 76
    saved = json.loads((leader.state_dir / "state.json").read_text())
    assert (saved["decided"] or {}).get("rung") == "second", saved  # on the volume before the exit
    decisions = leader.events("ladder_decision")
    assert decisions and decisions[-1]["action"] == "relaunch"
    # LWS recreates every pod: both daemons and their servers gone, then started afresh.
    for n in (worker, leader):
        n.cleanup()
    for n in (leader, worker):
        n.start()
    st = leader.wait(lambda s: group_ready(s) and s["rung"] == "second", 120, "the recreated group on rung second")
    assert [n["rung"] for n in st["group"]["nodes"]] == ["second", "second"]
    resumed = leader.events("decision_resumed")
    assert resumed and resumed[-1]["rung"] == "second"
    assert st["restarts_last_hour"] >= 1  # the hourly budget counts the recreation's relaunch
    wst = worker.wait(ready, 30, "the recreated worker ready")
    assert wst["rung"] == "second"


def test_a_node_away_at_start_is_waited_for_then_retried_on_the_same_rung(tmp_path, made) -> None:  # type: ignore[no-untyped-def]
    """Absence is not failure: node 1's daemon is not there; node 0 waits at the rendezvous, the
    leader waits absent_wait_s (6 s here) naming it, then one startup_stall naming node 1 that
    relaunches the same rung: the ladder does not move although retries_per_rung is 0."""
    leader, worker = group_of(
        tmp_path,
        fallback=[{"name": "second", "args": {"disable-custom-all-reduce": True}}],
        restart={"retries_per_rung": 0},
    )
    made.extend((leader, worker))
    leader.start()
    st = leader.wait(lambda s: "waiting for node 1" in (s["reason"] or ""), 60, "the leader waiting for node 1")
    assert st["incidents"] == 0 and leader.events("group_waiting")
    st = leader.wait(lambda s: s["incidents"] >= 1, 60, "the named stall after the wait")
    inc = st["last_incident"]
    assert inc["cause"] == "startup_stall" and "node 1" in inc["detail"], inc
    decision = (
        leader.wait(lambda s: bool(leader.events("ladder_decision")), 30, "the decision")
        and leader.events("ladder_decision")[-1]
    )
    assert decision["rung"] == 0  # the same rung: a node away is not a server fault
    assert leader.events("group_node_absent")  # the alert after absent_alert_s
    worker.start()
    st = leader.wait(group_ready, 90, "the group ready once node 1 is there")
    assert st["rung"] == "base"


@pytest.mark.parametrize(("late", "late_s"), [("worker", 15), ("worker", 60), ("leader", 15)])
def test_a_late_start_in_either_order_costs_no_incident(tmp_path, made, late: str, late_s: float) -> None:  # type: ignore[no-untyped-def]
    leader, worker = group_of(tmp_path, group={"absent_wait_s": 120.0})
    made.extend((leader, worker))
    first, second = (leader, worker) if late == "worker" else (worker, leader)
    first.start()
    time.sleep(late_s)
    second.start()
    st = leader.wait(group_ready, 120, "the group ready")
    assert st["incidents"] == 0 and st["restarts"] == 0, (st["last_incident"] or {}).get("detail")
    assert worker.status()["incidents"] == 0  # type: ignore[index]
