"""Issue 34, the group's leader through real daemons: killed while it captures, the incident keeps its
evidence on every node; killed in the backoff, its successor relaunches the members it stopped, on
the same rung; a restart to a rung one member lacks is refused before anything stops; a member found
on another rung than the group's is relaunched on the group's, with no ladder step."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from groupdaemons import Node, group_of, group_ready

from supervisor.common.waiting import wait_for
from supervisor.config.render import dump_toml

pytestmark = pytest.mark.integration


def start_group(made: list[Node], *nodes: Node) -> None:
    made.extend(nodes)
    for n in nodes:
        n.start()
    nodes[0].wait(group_ready, 90, "the group ready")


def slow_py_spy(tmp_path: Path, delay_s: float) -> Path:
    """py-spy whose dumps take `delay_s` longer: a capture that lasts long enough to be cut."""
    real = Path(sys.executable).parent / "py-spy"
    path = tmp_path / "slow-py-spy"
    path.write_text(f'#!/bin/sh\ncase "$1" in dump) sleep {delay_s};; esac\nexec {real} "$@"\n')
    path.chmod(0o755)
    return path


def scheduler_pids(st: dict[str, Any]) -> list[int]:
    return [p["pid"] for p in st["processes"] if p["role"] == "scheduler"]


def open_incident(node: Node) -> dict[str, Any] | None:
    doc = json.loads((node.state_dir / "state.json").read_text())
    inc: dict[str, Any] | None = doc.get("open_incident")
    return inc


def bundle(node: Node, incident: str) -> dict[str, Any] | None:
    path = node.state_dir / "diagnostics" / incident / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_the_leader_killed_while_capturing_leaves_a_bundle_on_every_node(tmp_path: Path, made: list[Node]) -> None:
    leader, worker = group_of(tmp_path, diagnostics={"py_spy_path": str(slow_py_spy(tmp_path, 3.0))})
    start_group(made, leader, worker)
    wst = worker.status()
    assert wst is not None
    os.kill(scheduler_pids(wst)[0], signal.SIGKILL)  # a worker's rank dies: the group's incident
    # The member was asked for its bundle (its journal says so) and the leader is still capturing its own.
    wait_for(
        lambda: worker.events("command"),
        lambda cmds: any(c["kind"] == "diagnose" and c["source"] == "group" for c in cmds),
        60,
        what="the leader asking node 1 for its bundle",
    )
    inc = open_incident(leader)
    assert inc is not None, "the leader's capture had ended before the kill"
    leader.kill_daemon()
    # The member's capture is not cut by the leader's request going away: its bundle is written.
    summary = wait_for(lambda: bundle(worker, inc["id"]), lambda s: s is not None, 60, what="node 1's bundle")
    assert summary is not None and summary["group"]["incident"] == inc["id"] and summary["group"]["node"] == 1
    # The successor completes the capture under the same id: node 0's bundle, and the member asked
    # again answers with the bundle it wrote (one bundle per node for one incident).
    leader.start()
    ev = wait_for(
        lambda: [e for e in leader.events("group_evidence") if e["id"] == inc["id"]],
        bool,
        60,
        what="the successor's group_evidence for the interrupted incident",
    )
    assert ev[-1]["bundles"] == {"1": inc["id"]}, ev
    own = wait_for(lambda: bundle(leader, inc["id"]), lambda s: s is not None, 60, what="node 0's bundle")
    assert own is not None and own["group"]["node"] == 0 and own["group"]["incident"] == inc["id"]
    assert not (worker.state_dir / "diagnostics" / f"{inc['id']}-2").exists()
    # The bundle's directory appears (renamed into place) a moment before its incident is journalled.
    booked = wait_for(
        lambda: [e for e in leader.events("incident") if e.get("id") == inc["id"]],
        bool,
        30,
        what="the successor's incident for the interrupted capture",
    )
    assert booked[-1]["bundle"] == inc["id"] and booked[-1].get("interrupted") is True
    # And the group comes back as one.
    st = leader.wait(lambda s: group_ready(s) and s["group"]["status"] == "ok", 120, "the group ready again")
    assert st["group"]["nodes"][1]["rung"] == st["rung"]


def test_the_leader_killed_in_the_backoff_its_successor_relaunches_the_members_on_the_same_rung(
    tmp_path: Path, made: list[Node]
) -> None:
    leader, worker = group_of(
        tmp_path,
        fallback=[{"name": "second", "args": {"disable-custom-all-reduce": True}}],
        restart={"retries_per_rung": 1, "backoff_initial_s": 20.0, "backoff_max_s": 40.0},
    )
    start_group(made, leader, worker)
    wst = worker.status()
    assert wst is not None
    # The first dead rank after `base` served is relaunched at once on it (issue 49: a rung that served
    # keeps its standing, once in a row); the second is judged by the retries: a retry after a backoff.
    os.kill(scheduler_pids(wst)[0], signal.SIGKILL)
    wait_for(lambda: leader.events("ladder_decision"), bool, 60, what="the free relaunch")
    leader.wait(lambda s: group_ready(s) and s["group"]["status"] == "ok", 90, "the group ready again")
    wst = worker.wait(lambda s: s["state"] == "ready" and s["pid"] != wst["pid"], 30, "node 1 relaunched")
    os.kill(scheduler_pids(wst)[0], signal.SIGKILL)
    decided = wait_for(lambda: leader.events("ladder_decision"), lambda d: len(d) >= 2, 60, what="the retry")
    assert decided[-1]["action"] == "relaunch" and decided[-1]["backoff_s"] >= 10, decided  # a retry of base
    stops = leader.events("group_stop")
    assert stops and stops[-1]["nodes"][0]["ok"]  # the member was stopped and verified before the kill
    assert json.loads((leader.state_dir / "group.json").read_text()) == {"members_stopped": True}
    worker.wait(lambda s: s["state"] == "stopped" and s["pid"] is None, 10, "node 1 stopped by the group")
    leader.kill_daemon()  # in the backoff: the decision and the stopped members are on disk only
    leader.start()
    resumed = wait_for(lambda: leader.events("decision_resumed"), bool, 90, what="the successor resuming")
    assert resumed[-1]["rung"] == "base"
    st = leader.wait(lambda s: group_ready(s) and s["group"]["status"] == "ok", 120, "the group relaunched together")
    assert st["rung"] == "base" and st["group"]["nodes"][1]["rung"] == "base"
    launches = leader.events("group_launch")
    assert launches and launches[-1]["rung"] == "base" and launches[-1]["nodes"][0]["ok"], launches
    # The ladder never stepped: the two decisions are the predecessor's, node 1 launched by the group on base.
    assert len(leader.events("ladder_decision")) == 2
    assert [e["rung"] for e in worker.events("server_launched")] == ["base", "base", "base"]
    assert [e["cause"] for e in leader.events("incident")] == ["rank_died", "rank_died"]
    assert json.loads((leader.state_dir / "group.json").read_text()) == {"members_stopped": False}


def test_a_restart_to_a_rung_a_member_lacks_is_refused_before_anything_stops(tmp_path: Path, made: list[Node]) -> None:
    leader, worker = group_of(tmp_path, fallback=[{"name": "second", "args": {"disable-custom-all-reduce": True}}])
    start_group(made, leader, worker)
    # Node 1's config loses rung `second` (a reload): its reports say so, its server serves on.
    worker.config.write_text(dump_toml(worker.settings.model_copy(update={"fallback": ()})))
    assert worker.post("/reload").status_code == 200
    leader.wait(lambda s: "node 1's config differs" in s["group"]["reason"], 20, "node 1's new config seen")
    before = {n.rank: (n.status() or {}).get("pid") for n in (leader, worker)}
    r = leader.post("/restart", {"rung": "second", "reason": "test"})
    assert r.status_code == 409, r.text
    assert "node 1" in r.text and "'second'" in r.text, r.text
    time.sleep(2)  # nothing was stopped, on any node
    assert not leader.events("group_stop") and not worker.events("server_stopped")
    after = {n.rank: (n.status() or {}).get("pid") for n in (leader, worker)}
    assert after == before and all(after.values())
    assert worker.status()["state"] == "ready"  # type: ignore[index]
    # A rung every node has is still taken by the whole group.
    assert leader.post("/restart", {"rung": "base", "reason": "test"}).status_code == 202
    leader.wait(lambda s: s["restarts"] >= 1 or s["incidents"] >= 1, 30, "the group restart under way")


def test_a_member_found_on_another_rung_is_relaunched_on_the_groups_without_a_ladder_step(
    tmp_path: Path, made: list[Node]
) -> None:
    leader, worker = group_of(
        tmp_path,
        fallback=[{"name": "second", "args": {"disable-custom-all-reduce": True}}],
        group={"absent_wait_s": 120.0},  # node 0 waits for node 1 at the rendezvous; no incident meanwhile
    )
    start_group(made, leader, worker)
    old = (worker.status() or {}).get("pid")
    worker.kill_daemon()  # its server serves on, on rung base
    assert leader.post("/restart", {"rung": "second", "reason": "test"}).status_code == 202
    wait_for(
        lambda: leader.events("server_launched"),
        lambda evs: evs[-1]["rung"] == "second",
        60,
        what="node 0 relaunched on rung second",
    )
    decisions = len(leader.events("ladder_decision"))
    worker.start()  # adopts its base server: a member on another rung than the group's
    found = wait_for(lambda: leader.events("group_mismatch"), bool, 60, what="the leader's group_mismatch")
    assert found[0]["node"] == 1 and "runs rung 'base'" in found[0]["reason"] and found[0]["relaunch"] == "second"
    st = leader.wait(
        lambda s: group_ready(s) and s["group"]["nodes"][1]["rung"] == "second", 90, "the group whole on second"
    )
    assert st["rung"] == "second"
    wst = worker.status()
    assert wst is not None and wst["rung"] == "second" and wst["pid"] != old
    fixed = [e for e in leader.events("group_launch") if e.get("mismatch")]
    assert fixed and fixed[-1]["rung"] == "second" and all(n["ok"] for n in fixed[-1]["nodes"]), fixed
    assert len(leader.events("ladder_decision")) == decisions, leader.events("ladder_decision")  # no ladder step
    assert [e["cause"] for e in leader.events("incident")] == ["manual"]
    assert [e["rung"] for e in worker.events("server_adopted")] == ["base"]
    assert [e["rung"] for e in worker.events("server_launched")] == ["base", "second"]
