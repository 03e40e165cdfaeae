"""The ladder's decision is saved when it is made, before the backoff (issue 27, item 5).

The attack: a daemon killed (crash) or handed over during an incident's backoff left state.json
naming the rung that just failed, and the successor relaunched it: on real hardware one more full
load and one more stall window each time.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from daemonproc import cleanup, start, wait_status
from statedir import events

from supervisor.config.render import dump_toml as to_toml

pytestmark = pytest.mark.integration

NO_GRAPH = {"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}


def wait_event(state_dir: Path, name: str, timeout: float, after: int = 0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in events(state_dir)[after:] if e["event"] == name]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no {name} within {timeout} s: {[e['event'] for e in events(state_dir)]}")


@pytest.mark.parametrize("how", ["crash", "handoff"])
def test_a_successor_relaunches_the_decided_rung_not_the_one_that_failed(sim, tmp_path: Path, how: str) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        "deadlock_after_load",
        env={"SGLANG_SIM_UNLESS": "disable-cuda-graph"},
        fallback=[NO_GRAPH],
        diagnostics={"py_spy": False},
        restart={"backoff_initial_s": 30.0, "backoff_max_s": 30.0, "start_from": "last_good"},
    )
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    state_dir = Path(s.paths.state_dir)
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    try:
        decision = wait_event(state_dir, "ladder_decision", 60)
        assert decision["rung"] == 1 and decision["backoff_s"] >= 20
        saved = json.loads((state_dir / "state.json").read_text())
        assert saved["decided"]["rung"] == "no-cuda-graph"  # on disk before the backoff ends
        assert saved["current"] == "base"  # the failed rung is still the current one
        seen = len(events(state_dir))
        if how == "crash":
            proc.kill()
            proc.wait(10)
            proc = start(cfg, dict(os.environ))
        else:
            proc.send_signal(signal.SIGUSR2)  # re-executes in place
        resumed = wait_event(state_dir, "decision_resumed", 30, after=seen)
        assert resumed["rung"] == "no-cuda-graph" and 0 < resumed["backoff_s"] <= 30
        # The backoff is honoured where it left off; a start now makes it go at once.
        st = wait_status(api, lambda x: x["state"] == "restarting", 20, proc)
        assert st["rung"] == "base" and st["next_attempt_in_s"] > 5
        import httpx

        httpx.post(f"{api}/start", json={}, timeout=10)
        st = wait_status(api, lambda x: x["state"] == "ready", 60, proc)
        assert st["rung"] == "no-cuda-graph"
        launched = [e["rung"] for e in events(state_dir) if e["event"] == "server_launched"]
        assert launched == ["base", "no-cuda-graph"], launched
        assert json.loads((state_dir / "state.json").read_text())["decided"] is None
    finally:
        cleanup(proc, str(state_dir))
