"""Two daemons, two state directories, one server port (a copied config whose `[server] port` was
forgotten): the second never touches the first one's server. `check-config` says so before any
`run`; `run` refuses to launch, naming the first daemon; once the first daemon is SIGKILLed (its
lock freed by the kernel, its tree left running) the second stops that leftover and launches."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from daemonproc import cleanup, start, wait_status
from freeport import free_port
from statedir import events

from probes.ports import port_accepts
from supervisor.config.render import dump_toml as to_toml
from supervisor.config.render import render_rung
from supervisor.config.settings import settings_from_mapping
from supervisor.process import ServerProcess, kill_marked

pytestmark = pytest.mark.integration


def alive(pid: int) -> bool:
    try:
        return ") Z " not in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False


def test_a_second_daemon_on_the_same_server_port_never_stops_the_first_ones_server(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = sim("ok", tp=1)
    cfg1 = tmp_path / "first.toml"
    cfg1.write_text(to_toml(first))
    data = json.loads(first.model_dump_json())
    data["paths"] = {**data["paths"], "state_dir": str(tmp_path / "second-state")}
    data["api"]["port"] = free_port()  # the state_dir and the API port changed, the server port forgotten
    data["restart"] = {**data["restart"], "backoff_initial_s": 0.5, "backoff_max_s": 1.0}
    second = settings_from_mapping(data)
    cfg2 = tmp_path / "second.toml"
    cfg2.write_text(to_toml(second))
    port, state1 = first.server.port, str(Path(first.paths.state_dir).resolve())
    api1, api2 = f"http://127.0.0.1:{first.api.port}", f"http://127.0.0.1:{second.api.port}"

    proc1 = start(cfg1, dict(os.environ))
    proc2: subprocess.Popen[bytes] | None = None
    try:
        server = wait_status(api1, lambda x: x["state"] == "ready", 40, proc1)["pid"]

        # check-config, before any run: the port is the other daemon's
        cmd = [sys.executable, "-m", "supervisor", "check-config", "--config", str(cfg2)]
        checked = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ))
        out = checked.stdout + checked.stderr
        assert checked.returncode != 0, out
        assert f"error: server.port: port {port} is held by the server of another sglang-supervisor daemon" in out
        assert f"pid {proc1.pid}" in out and state1 in out and str(cfg1.resolve()) in out, out
        ok = subprocess.run([*cmd[:-1], str(cfg1)], capture_output=True, text=True, timeout=60, env=dict(os.environ))
        assert "server.port" not in ok.stdout + ok.stderr  # its own daemon's tree is not a finding

        proc2 = start(cfg2, dict(os.environ))
        snap = wait_status(api2, lambda x: "another sglang-supervisor daemon" in x["reason"], 40, proc2)
        assert snap["pid"] is None and snap["state"] == "restarting"
        assert f"pid {proc1.pid}" in snap["reason"] and state1 in snap["reason"] and f"port {port}" in snap["reason"]
        refused = [e for e in events(second.paths.state_dir) if e["event"] == "launch_refused"]
        assert refused and str(cfg1.resolve()) in str(refused[0]["holder"]), refused
        assert not [e for e in events(second.paths.state_dir) if e["event"] == "leftovers_stopped"]
        time.sleep(2.0)  # a few refusals and retries later, the first one's server is untouched
        st = httpx.get(f"{api1}/status", timeout=5).json()
        assert st["state"] == "ready" and st["pid"] == server and st["restarts"] == 0, st
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        assert not [e for e in events(state1) if e["event"] in ("incident", "server_stopped")]

        # The first daemon dies by SIGKILL: its lock is freed, its server is left running.
        proc1.send_signal(signal.SIGKILL)
        proc1.wait(10)
        assert alive(server)
        snap = wait_status(api2, lambda x: x["state"] == "ready", 60, proc2)
        assert snap["pid"] != server and not alive(server)
        (swept,) = [e for e in events(second.paths.state_dir) if e["event"] == "leftovers_stopped"]
        assert server in swept["pids_found"], swept  # type: ignore[operator]
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    finally:
        if proc2 is not None:
            cleanup(proc2, str(second.paths.state_dir))
        cleanup(proc1, state1)


async def test_a_tree_whose_daemon_cannot_be_found_is_kept_and_the_launch_refused(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    """A tree on the port with a marker that names no state directory (an older version's, or one
    started by hand): nothing proves whose it is, so it is never signalled; the refusal names it."""
    s = sim("ok", tp=1, restart={"backoff_initial_s": 0.5, "backoff_max_s": 1.0})
    rendered = render_rung(s.server, s.ladder[0])
    stranger = ServerProcess.spawn(rendered.argv, {**os.environ, **rendered.env}, "unknownmarker42")
    try:
        deadline = time.monotonic() + 60
        while not port_accepts("127.0.0.1", s.server.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        r = await daemon(s)
        snap = await r.wait_for(lambda x: "cannot be found" in x.reason, 30, "the refusal")
        assert f"pid {stranger.pid}" in snap.reason and "unknownmarker42" in snap.reason and snap.pid is None
        await asyncio.sleep(1.5)
        assert stranger.poll() is None and port_accepts("127.0.0.1", s.server.port)
        assert not [e for e in events(s.state_dir) if e["event"] == "leftovers_stopped"]
    finally:
        kill_marked("unknownmarker42", grace_s=0.5)
        stranger.poll()
        for stream in (stranger.stdout, stranger.stderr):
            stream.close()
