"""Bringing the service back: the fallback ladder end to end, with verified stops, against the simulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from daemonproc import marker_of, wait_status
from statedir import events

from supervisor.config.render import dump_toml as to_toml
from supervisor.process import kill_marked

pytestmark = pytest.mark.integration

NO_GRAPH = {"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}


async def test_full_story_deadlock_then_fallback_rung_serves(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("deadlock_after_load", env={"SGLANG_SIM_UNLESS": "disable-cuda-graph"}, fallback=[NO_GRAPH])
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.state == "ready", 60, "ready on the fallback rung")
    assert snap.rung == "no-cuda-graph" and snap.last_good_rung == "no-cuda-graph"
    inc = snap.last_incident
    assert inc is not None and inc.cause == "startup_stall" and inc.hang_class == "idle_deadlock"
    assert inc.rung == "base" and inc.bundle is not None
    bundle = Path(s.paths.state_dir) / "diagnostics" / inc.bundle
    assert (bundle / "summary.json").exists() and "_sync_weights_to_graph_pool" in (bundle / "summary.txt").read_text()
    ev = events(s.paths.state_dir)
    stopped = next(e for e in ev if e["event"] == "server_stopped")
    assert stopped["survivors"] == [] and stopped["port_free"] is True
    # true only when NVML verified it; this machine may have no NVML
    assert stopped["gpu_released"] == (True if stopped["gpu_check"] == "nvml" else "unverified")
    launches = [e["rung"] for e in ev if e["event"] == "server_launched"]
    assert launches == ["base", "no-cuda-graph"]
    assert (
        "--disable-cuda-graph"
        in next(e for e in ev if e["event"] == "server_launched" and e["rung"] == "no-cuda-graph")["argv"]
    )
    async with httpx.AsyncClient() as c:
        status = (await c.get(f"{r.api}/status")).json()
    assert status["state"] == "ready" and status["last_incident"]["id"] == inc.id
    state = json.loads((Path(s.paths.state_dir) / "state.json").read_text())
    assert state["last_good"] == "no-cuda-graph"


async def test_on_match_jumps_ahead_of_earlier_rungs(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        "deadlock_after_load",
        env={"SGLANG_SIM_UNLESS": "disable-cuda-graph"},
        restart={"retries_per_rung": 2},
        fallback=[
            {"name": "smaller-graphs", "args": {"cuda-graph-max-bs": 8}},
            {**NO_GRAPH, "on": ["idle_deadlock"]},
        ],
    )
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")
    launches = [e["rung"] for e in events(s.paths.state_dir) if e["event"] == "server_launched"]
    assert launches == ["base", "no-cuda-graph"], "skipped smaller-graphs and the retries of base"


async def test_escaped_descendant_holding_the_port_is_killed_before_relaunch(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("escape_group", restart={"retries_per_rung": 3})
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    server_pid = r.snap().pid
    marker = marker_of(server_pid)
    assert marker is not None
    escaped = [
        p.pid
        for p in psutil.process_iter()
        if p.pid != os.getpid()
        and _has_marker(p.pid, marker)
        and os.getsid(p.pid) != os.getsid(server_pid or 0)
    ]
    assert escaped, "the simulator's helper left the session"
    async with httpx.AsyncClient() as c:
        resp = await c.post(f"{r.api}/restart", json={"reason": "test"})
    assert resp.status_code == 202
    await r.wait_for(
        lambda x: x.state == "ready" and x.restarts == 0 and x.last_incident is not None, 30, "ready again"
    )
    for pid in escaped:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    stopped = next(e for e in events(s.paths.state_dir) if e["event"] == "server_stopped")
    assert stopped["port_free"] is True and stopped["survivors"] == []
    assert set(escaped) <= set(stopped["pids_found"])


def _has_marker(pid: int, marker: str) -> bool:
    try:
        return f"SGLANG_SUPERVISOR_MARKER={marker}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def test_daemon_killed_mid_ladder_resumes_and_kills_an_old_tree_it_cannot_verify(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        "deadlock_after_load",
        env={"SGLANG_SIM_UNLESS": "disable-cuda-graph"},
        fallback=[NO_GRAPH],
        restart={"start_from": "last_good"},
    )
    cfg = tmp_path / "config.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    cmd = [sys.executable, "-m", "supervisor", "run", "--config", str(cfg), "--log-json"]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        st = wait_status(api, lambda x: x["rung"] == "no-cuda-graph" and x["state"] == "ready", 60)
        old_pid = st["pid"]
        first.send_signal(signal.SIGKILL)  # the daemon dies; its server tree lives on in its own session
        first.wait(10)
        assert psutil.pid_exists(old_pid)
        # A record that no longer matches the process (here its start time) must not be adopted:
        # the tree is stopped as a leftover (tests/integration/test_adoption.py adopts a matching one).
        state = Path(s.paths.state_dir) / "state.json"
        doc = json.loads(state.read_text())
        doc["server"]["starttime"] += 1
        state.write_text(json.dumps(doc))
        second = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            st = wait_status(api, lambda x: x["state"] == "ready" and x["pid"] != old_pid, 60)
            assert st["rung"] == "no-cuda-graph"
            ev = events(s.paths.state_dir)
            restart_at = max(
                i for i, e in enumerate(ev) if e["event"] == "state_loaded" or e["event"] == "leftovers_stopped"
            )
            stopped = [e for e in ev if e["event"] == "leftovers_stopped" and old_pid in e["pids_found"]]
            assert stopped and stopped[0]["port_free"] is True and stopped[0]["survivors"] == []
            later = [e["rung"] for e in ev[restart_at:] if e["event"] == "server_launched"]
            assert later == ["no-cuda-graph"], "the failed rung was not tried again"
            assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0
    finally:
        for p in (first, locals().get("second")):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
        marker = json.loads((Path(s.paths.state_dir) / "state.json").read_text())["marker"]
        kill_marked(marker, grace_s=0.5)
