"""A restarted daemon adopts the server its predecessor left running: real daemons, signals, ports, HTTP.

The daemon is SIGKILLed (as a crash or a systemd watchdog abort would end it) or handed over with
SIGUSR2 (an upgrade); the server serves on through the gap, its log lines all reach the files, and
the successor adopts the very same process. A process that merely has the saved pid is never adopted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from daemonproc import cleanup, marked, start, wait_status
from statedir import events, server_log
from waiting import wait_for

from supervisor.config.render import dump_toml as to_toml

pytestmark = pytest.mark.integration


def generate(port: int, tag: str = "") -> int:
    """One request; a `tag` shows in the server's access line (`POST /generate?tag HTTP/1.1`)."""
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 4}}
    url = f"http://127.0.0.1:{port}/generate" + (f"?{tag}" if tag else "")
    return httpx.post(url, json=body, timeout=10).status_code


ACCESS = re.compile(r'"POST /generate(\?\S*)? HTTP/1\.1" 200')


def test_killed_and_handed_over_daemons_leave_the_server_serving_and_the_successor_adopts_it(
    sim, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=2)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    state_dir = s.paths.state_dir
    port = s.server.port
    proc = start(cfg, dict(os.environ))
    try:
        pid = wait_status(api, lambda x: x["state"] == "ready", 40, proc)["pid"]
        before = len(ACCESS.findall(server_log(state_dir)))  # the server's own warm-up request
        sent = [generate(port)]

        proc.kill()  # a crash: no handler runs, nothing is flushed
        proc.wait(10)
        sent += [generate(port, f"gap={i}") for i in range(5)]  # served while no daemon runs
        assert psutil.Process(pid).is_running()

        proc = start(cfg, dict(os.environ))
        st = wait_status(api, lambda x: x["state"] == "ready", 30, proc)
        assert st["pid"] == pid
        # The successor read the lines written while no daemon ran: they are in its log tail.
        diag = httpx.post(f"{api}/diagnose", json={}, timeout=60).json()
        tail = httpx.get(f"{api}/diagnostics/{diag['bundle_id']}/log-tail.txt", timeout=10).text
        assert all(f"/generate?gap={i} " in tail for i in range(5)), tail[-2000:]
        sent.append(generate(port))

        adopted = sum(e["event"] == "server_adopted" for e in events(state_dir))
        proc.send_signal(signal.SIGUSR2)  # the documented upgrade handoff: the daemon re-executes itself
        sent += [generate(port) for _ in range(3)]
        assert wait_for(lambda: sum(e["event"] == "server_adopted" for e in events(state_dir)) > adopted, 30)
        st = wait_status(api, lambda x: x["state"] == "ready", 30, proc)  # the same process, new image
        assert st["pid"] == pid and st["restarts"] == 0 and proc.poll() is None

        assert sent == [200] * 10
        # Every request's access line reached the log, the ones made while no daemon ran included.
        assert wait_for(lambda: len(ACCESS.findall(server_log(state_dir))) == before + 10, 10)
        ev = events(state_dir)
        assert [e["pid"] for e in ev if e["event"] == "server_adopted"] == [pid, pid]
        assert [e["event"] for e in ev].count("server_launched") == 1
        assert next(e for e in ev if e["event"] == "daemon_handoff")["pid"] == pid

        marker = json.loads((Path(state_dir) / "state.json").read_text())["marker"]
        tree = marked(marker)
        assert pid in tree
        proc.send_signal(signal.SIGTERM)  # an explicit stop stops the server
        assert proc.wait(30) == 0
        assert wait_for(lambda: marked(marker) == [], 10)
    finally:
        cleanup(proc, state_dir)


def test_a_process_that_reuses_the_saved_pid_is_never_adopted(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    state_dir = Path(s.paths.state_dir)
    state_dir.mkdir(parents=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    starttime = int(Path(f"/proc/{stranger.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    # The saved record names the stranger's pid with its true start time: only the marker tells it apart.
    saved = {
        "version": 1,
        "marker": "feedfacecafebeef",
        "rungs": ["base"],
        "current": "base",
        "server": {"pid": stranger.pid, "starttime": starttime, "rung": "base", "launched_wall": 1.0, "log": None},
    }
    (state_dir / "state.json").write_text(json.dumps(saved))
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    proc = start(cfg, dict(os.environ))
    try:
        st = wait_status(f"http://127.0.0.1:{s.api.port}", lambda x: x["state"] == "ready", 40, proc)
        assert st["pid"] != stranger.pid
        ev = events(str(state_dir))
        refused = [e for e in ev if e["event"] == "adoption_refused"]
        assert refused and "marker" in refused[0]["reason"] and refused[0]["pid"] == stranger.pid
        assert not any(e["event"] == "server_adopted" for e in ev)
        assert stranger.poll() is None  # left alone: it is not ours
    finally:
        stranger.kill()
        stranger.wait(5)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        finally:
            cleanup(proc, str(state_dir))


def test_an_adopted_server_is_judged_by_the_usual_rules(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A load slow enough to kill the daemon mid-way; one retry, so an exit is relaunched on the same rung.
    s = sim("ok", tp=2, env={"SGLANG_SIM_PACE": "0.6"}, restart={"retries_per_rung": 1})
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    state_dir = s.paths.state_dir
    proc = start(cfg, dict(os.environ))
    try:
        pid = wait_status(api, lambda x: x["state"] == "starting" and x["pid"] is not None, 40, proc)["pid"]
        proc.kill()
        proc.wait(10)
        proc = start(cfg, dict(os.environ))
        # Still loading when adopted: it is left to finish, and becomes ready under the new daemon.
        st = wait_status(api, lambda x: x["pid"] == pid, 60, proc)  # a loaded CI host starts daemons slowly
        assert st["state"] == "starting", st
        assert wait_for(lambda: any(e["event"] == "server_adopted" for e in events(state_dir)), 10)
        wait_status(api, lambda x: x["state"] == "ready" and x["pid"] == pid, 60, proc)

        os.kill(pid, signal.SIGKILL)  # not the daemon's child: the exit is seen through /proc
        st = wait_status(api, lambda x: x["state"] == "ready" and x["pid"] not in (None, pid), 60, proc)
        assert st["last_incident"]["cause"] == "exited"
        assert st["restarts"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        finally:
            cleanup(proc, state_dir)


def test_a_stop_by_request_outlives_a_daemon_restart_and_a_service_stop_does_not(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    state_dir = s.paths.state_dir
    proc = start(cfg, dict(os.environ))
    try:
        wait_status(api, lambda x: x["state"] == "ready", 40, proc)
        assert httpx.post(f"{api}/stop", json={}, timeout=30).status_code < 300
        wait_status(api, lambda x: x["state"] == "stopped", 30, proc)
        proc.kill()  # a crash while the operator has the server stopped
        proc.wait(10)
        proc = start(cfg, dict(os.environ))
        assert wait_for(lambda: any(e["event"] == "stayed_stopped" for e in events(state_dir)), 20)
        assert wait_status(api, lambda x: True, 10, proc)["state"] == "stopped"
        assert [e["event"] for e in events(state_dir)].count("server_launched") == 1

        assert httpx.post(f"{api}/start", json={}, timeout=30).status_code < 300
        wait_status(api, lambda x: x["state"] == "ready", 40, proc)
        proc.send_signal(signal.SIGTERM)  # a service stop: the next service start starts the server
        assert proc.wait(30) == 0
        proc = start(cfg, dict(os.environ))
        wait_status(api, lambda x: x["state"] == "ready", 40, proc)
        assert [e["event"] for e in events(state_dir)].count("server_launched") == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        finally:
            cleanup(proc, state_dir)
