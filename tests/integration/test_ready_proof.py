"""Ready is proven by the server's own tree, never by a log line (issue 27, items 2 and 3).

The attacks: a child that prints SGLang's ready line and never binds its port was judged `ready`
and its rung recorded as `last_good`; an orphan of an earlier launch answering on the port made the
new launch look ready. Now the line is a phase hint, and ready needs the port bound by this tree
and a health answer from it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from statedir import events

pytestmark = pytest.mark.integration

# Prints the ready line and never binds: a forged (or broken) server.
FORGER = r"""
import time
print("INFO:     Uvicorn running on http://127.0.0.1:1 (Press CTRL+C to quit)", flush=True)
print("The server is fired up and ready to roll!", flush=True)
time.sleep(3600)
"""

# Binds, answers /health, prints the line: a minimal honest server.
HONEST = r"""
import http.server, sys, threading
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
print("The server is fired up and ready to roll!", flush=True)
srv.serve_forever()
"""


def alive(pid: int) -> bool:
    """Running, not a zombie (a test process that became a subreaper may hold the old one's status)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_ready_line_without_a_bound_port_is_a_startup_stall_never_last_good(
    daemon, sim, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "forger.py"
    script.write_text(FORGER)
    s = sim(
        "ok", tp=1, watchdog={"startup_stall_s": 3.0, "cpu_only_stall_s": 6.0}, restart={"max_restarts_per_hour": 1}
    )
    server = s.server.model_copy(update={"command": (sys.executable, str(script)), "args": {}})
    s = s.model_copy(update={"server": server})
    r = await daemon(s)
    snap: Any = await r.wait_for(lambda x: x.last_incident is not None, 30, "an incident")
    assert snap.last_incident.cause == "startup_stall", snap.last_incident
    ev = events(Path(s.paths.state_dir))
    assert not any(e["event"] == "server_ready" for e in ev)
    saved = json.loads((Path(s.paths.state_dir) / "state.json").read_text())
    assert saved.get("last_good") is None, saved


async def test_an_orphan_answering_on_the_port_does_not_make_the_new_launch_ready(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # After the launch, an orphan (not of this tree) binds the server port and answers /health,
    # while this launch's own child prints the ready line into server.log and never binds.
    honest = tmp_path / "honest.py"
    honest.write_text(HONEST)
    forger = tmp_path / "forger.py"
    forger.write_text(FORGER)
    s = sim(
        "ok", tp=1, watchdog={"startup_stall_s": 3.0, "cpu_only_stall_s": 6.0}, restart={"max_restarts_per_hour": 1}
    )
    server = s.server.model_copy(update={"command": (sys.executable, str(forger)), "args": {}})
    s = s.model_copy(update={"server": server})
    r = await daemon(s)
    orphan = subprocess.Popen([sys.executable, str(honest), "--port", str(s.server.port)], stdout=subprocess.PIPE)
    try:
        assert orphan.stdout is not None
        orphan.stdout.readline()  # bound
        with socket.create_connection(("127.0.0.1", s.server.port), timeout=2):
            pass
        assert r.snap().state == "starting"
        snap: Any = await r.wait_for(lambda x: x.last_incident is not None, 30, "the stall")
        assert snap.last_incident.cause == "startup_stall", snap.last_incident
        ev = events(Path(s.paths.state_dir))
        assert not any(e["event"] == "server_ready" for e in ev), [e["event"] for e in ev]
    finally:
        orphan.kill()
        orphan.wait(5)
        assert orphan.stdout is not None
        orphan.stdout.close()


async def test_an_honest_server_is_ready_promptly_and_recorded_last_good(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "honest.py"
    script.write_text(HONEST)
    s = sim("ok", tp=1)
    server = s.server.model_copy(update={"command": (sys.executable, str(script)), "args": {}})
    s = s.model_copy(update={"server": server})
    r = await daemon(s)
    snap: Any = await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    assert snap.time_to_ready_s < 10
    assert json.loads((Path(s.paths.state_dir) / "state.json").read_text()).get("last_good") == "base"


def test_a_lost_state_json_still_finds_the_starting_tree_by_its_marker(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The attack: state.json garbage while the server was still starting (no port bound yet); the
    old tree was invisible, a second one launched beside it, and the orphan's ready line made the
    new launch `ready` before it failed with EADDRINUSE."""
    import os
    import time

    import psutil
    from daemonproc import cleanup, start, wait_status

    from supervisor.config.render import dump_toml as to_toml
    from supervisor.daemon.persist import marker_for

    slow = sim("ok", tp=1, env={"SGLANG_SIM_PACE": "3.0"})
    cfg = tmp_path / "slow.toml"
    cfg.write_text(to_toml(slow))
    state_dir = Path(slow.paths.state_dir)
    api = f"http://127.0.0.1:{slow.api.port}"
    proc = start(cfg, dict(os.environ))
    try:
        old_pid = wait_status(api, lambda x: x["state"] == "starting" and x["pid"], 40, proc)["pid"]
        proc.kill()  # a crash while the server is still loading, and then state.json is lost
        proc.wait(10)
        (state_dir / "state.json").write_text("{garbage")
        time.sleep(0.5)
        assert psutil.pid_exists(old_pid)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", slow.server.port), timeout=0.5).close()

        fast = slow.model_copy(
            update={"server": slow.server.model_copy(update={"env": {**slow.server.env, "SGLANG_SIM_PACE": "0.15"}})}
        )
        cfg2 = tmp_path / "fast.toml"
        cfg2.write_text(to_toml(fast))
        proc = start(cfg2, dict(os.environ))
        st = wait_status(api, lambda x: x["state"] == "ready", 60, proc)
        assert st["pid"] != old_pid and not alive(old_pid)
        ev = events(state_dir)
        stopped = [e for e in ev if e["event"] == "leftovers_stopped"]
        assert stopped and old_pid in stopped[-1]["pids_found"], [e["event"] for e in ev]
        # Why a server was stopped rather than adopted (a reload, had it been serving) is journalled.
        why = stopped[-1]["reason"]
        assert "no server record to adopt it by" in why and "saved state unreadable" in why
        assert not any(e["event"] == "launch_refused" for e in ev)
        assert json.loads((state_dir / "state.json").read_text())["marker"] == marker_for(state_dir)
    finally:
        cleanup(proc, str(state_dir))
