"""A SIGUSR2 handoff onto a configuration the new code refuses (issue 33): the old daemon stays in
charge, journals `handoff_refused` with the reason, and its server is untouched; once the file is
mended, the same signal hands off in place."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemonproc import cleanup, start, wait_status

from supervisor.config.render import dump_toml as to_toml

pytestmark = pytest.mark.integration


def journal(state_dir: str) -> list[dict[str, Any]]:
    path = Path(state_dir) / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def wait_event(state_dir: str, name: str, count: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in journal(state_dir) if e["event"] == name]
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no {count} x {name} in {timeout} s: {[e['event'] for e in journal(state_dir)][-20:]}")


def test_a_handoff_onto_a_refused_config_keeps_the_old_daemon_in_charge(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    good = to_toml(s)
    cfg.write_text(good)
    state_dir = str(s.paths.state_dir)
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    try:
        st = wait_status(api, lambda x: x["state"] == "ready", 120, proc)
        # The upgrade's new config names a token file that is not there: the new code would exit 2.
        cfg.write_text(good.replace("[api]", '[api]\ntoken_file = "/nonexistent/token"', 1))
        proc.send_signal(signal.SIGUSR2)
        refused = wait_event(state_dir, "handoff_refused", 1, 60)[0]
        assert "token_file" in refused["reason"] and "/nonexistent/token" in refused["reason"], refused
        assert proc.poll() is None, "the old daemon must stay"
        after = wait_status(api, lambda x: x["state"] == "ready", 30, proc)
        assert after["pid"] == st["pid"], "its server untouched"
        assert httpx.get(f"{api}/livez", timeout=10).status_code == 200
        assert not [e for e in journal(state_dir) if e["event"] in ("daemon_handoff", "server_adopted")]
        # Mended: the same signal now hands off (same daemon pid, the server adopted, not relaunched).
        cfg.write_text(good)
        proc.send_signal(signal.SIGUSR2)
        wait_event(state_dir, "server_adopted", 1, 60)
        final = wait_status(api, lambda x: x["state"] == "ready", 60, proc)
        assert final["pid"] == st["pid"] and proc.poll() is None
        assert [e["event"] for e in journal(state_dir)].count("server_launched") == 1
    finally:
        cleanup(proc, state_dir)
