"""SIGHUP that would move the state directory or the server port is refused whole, with a reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from daemonproc import status
from statedir import named
from waiting import wait

from supervisor.config.render import dump_toml as to_toml
from supervisor.process import kill_marked

pytestmark = pytest.mark.integration


def refusals(state_dir: Path) -> list[dict[str, Any]]:
    return named(state_dir, "config_reload_refused")


def test_reload_refuses_a_new_state_dir_or_port_and_keeps_everything(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "run", "--config", str(cfg)],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        st = wait(lambda: (x := status(api)) and x["state"] == "ready" and x, 60, "ready")
        pid = st["pid"]
        other = tmp_path / "elsewhere"
        moved = s.model_copy(update={"paths": s.paths.model_copy(update={"state_dir": str(other)})})
        cfg.write_text(to_toml(moved))
        proc.send_signal(signal.SIGHUP)
        first = wait(lambda: refusals(s.state_dir), 20, "the state_dir refusal")[0]
        assert "state_dir" in first["error"] and "restart the daemon" in first["error"]
        assert not (other / "events.jsonl").exists() and not (other / "state.json").exists(), "nothing half applied"
        new_port = s.server.model_copy(update={"port": s.server.port + 1})
        cfg.write_text(to_toml(s.model_copy(update={"server": new_port})))
        proc.send_signal(signal.SIGHUP)
        second = wait(lambda: len(refusals(s.state_dir)) >= 2 and refusals(s.state_dir)[1], 20, "the port refusal")
        assert "port" in second["error"]
        st = status(api)
        assert st is not None and st["state"] == "ready" and st["pid"] == pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            marker = json.loads((s.state_dir / "state.json").read_text())["marker"]
            kill_marked(marker, grace_s=0.5)
