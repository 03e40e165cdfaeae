"""One daemon per state directory: a second one refuses at once, names the holder, never touches the server.

The attack: two `sglang-supervisor run` on one config (or one state_dir with another API port); the
second adopted the first one's server and one `POST /restart` left both `failed` with no server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from daemonproc import cleanup, start, wait_status
from freeport import free_port
from statedir import events

from supervisor.config.render import dump_toml as to_toml
from supervisor.config.settings import settings_from_mapping

pytestmark = pytest.mark.integration


def run_second(cfg: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "supervisor", "run", "--config", str(cfg), "--log-json"]
    return subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, timeout=60)


def fd_targets(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def test_a_second_daemon_on_the_same_state_dir_refuses_at_once_and_leaves_the_server_alone(
    sim, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    state_dir = s.paths.state_dir
    proc = start(cfg, dict(os.environ))
    try:
        pid = wait_status(api, lambda x: x["state"] == "ready", 40, proc)["pid"]
        journal_before = len(events(str(state_dir)))

        # Same config (same API port), then the same state_dir behind another API port.
        other = settings_from_mapping({**json.loads(s.model_dump_json()), "api": {"port": free_port()}})
        cfg2 = tmp_path / "c2.toml"
        cfg2.write_text(to_toml(other))
        for c in (cfg, cfg2):
            t0 = time.monotonic()
            second = run_second(c)
            assert second.returncode == 3, second.stderr[-2000:]
            assert time.monotonic() - t0 < 20  # at once: no waiting for the holder (python start-up only)
            assert f"pid {proc.pid}" in second.stderr and "state_dir" in second.stderr, second.stderr[-2000:]
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{other.api.port}/livez", timeout=1)

        st = httpx.get(f"{api}/status", timeout=5).json()
        assert st["state"] == "ready" and st["pid"] == pid and st["restarts"] == 0
        assert len(events(str(state_dir))) == journal_before  # the refused daemons wrote nothing
        assert (Path(state_dir) / "daemon.lock").read_text().split()[0] == str(proc.pid)
        # The lock is the daemon's alone: neither the server nor the log keeper inherited it.
        assert any(t.endswith("/daemon.lock") for t in fd_targets(proc.pid))
        for child in (pid,):
            assert not any(t.endswith("/daemon.lock") for t in fd_targets(child))
        import psutil

        for p in psutil.Process(proc.pid).children(recursive=True):
            assert not any(t.endswith("/daemon.lock") for t in fd_targets(p.pid)), p.cmdline()
    finally:
        cleanup(proc, str(state_dir))


def test_a_busy_api_port_names_the_other_daemon_that_holds_it(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    proc = start(cfg, dict(os.environ))
    try:
        wait_status(f"http://127.0.0.1:{s.api.port}", lambda x: x["state"] != "stopped", 40, proc)
        # Another state_dir (so the lock lets it in) and another server port, the same API port.
        data = json.loads(s.model_dump_json())
        data["paths"] = {"state_dir": str(tmp_path / "other-state")}
        data["server"]["port"] = free_port()
        cfg2 = tmp_path / "c2.toml"
        cfg2.write_text(to_toml(settings_from_mapping(data)))
        second = run_second(cfg2)
        assert second.returncode == 2
        assert f"held by another sglang-supervisor daemon (pid {proc.pid})" in second.stderr, second.stderr[-2000:]
        assert "(set [api] port)" in second.stderr
    finally:
        cleanup(proc, str(s.paths.state_dir))
