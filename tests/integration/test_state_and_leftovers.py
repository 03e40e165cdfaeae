"""A poisoned state.json and a tree an earlier daemon left behind, through the running daemon."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from daemonproc import marker_of
from statedir import events

from probes.ports import port_accepts
from supervisor.config.render import render_rung
from supervisor.process import ServerProcess, kill_marked
from supervisor.process.owners import STATE_DIR_ENV

pytestmark = pytest.mark.integration


def poison(state_dir: Path, **doc: Any) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "state.json").write_text(json.dumps(doc))


async def test_malformed_state_starts_afresh_and_still_stops_the_old_tree(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    # The tree an earlier daemon launched, still serving on the port, with a marker nobody remembers;
    # it publishes its state directory, as every tree does (supervisor.process.owners).
    rendered = render_rung(s.server, s.ladder[0])
    env = {**os.environ, **rendered.env, STATE_DIR_ENV: str(s.state_dir.resolve())}
    old = ServerProcess.spawn(rendered.argv, env, "lostmarker0123")
    try:
        deadline = time.monotonic() + 60
        while not port_accepts("127.0.0.1", s.server.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert port_accepts("127.0.0.1", s.server.port), "the old server listens"
        poison(s.state_dir, marker="abc\0def", consecutive_failures="many", current="base")
        r = await daemon(s)
        await r.wait_for(lambda x: x.state == "ready", 60, "ready on its own server")
        ev = events(s.state_dir)
        started = next(e for e in ev if e["event"] == "daemon_started")
        assert "malformed" in started["state"], started
        stopped = next(e for e in ev if e["event"] == "leftovers_stopped")
        assert old.pid in stopped["pids_found"] and stopped["survivors"] == [] and stopped["port_free"] is True
        assert old.poll() is not None, "the old main process was stopped"
        assert r.snap().pid != old.pid and marker_of(r.snap().pid) not in (None, "lostmarker0123")
    finally:
        kill_marked("lostmarker0123", grace_s=0.5)
        old.poll()
        old.stdout.close()
        old.stderr.close()


async def test_a_huge_saved_failure_count_is_clamped(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        "crash_on_load",
        tp=1,
        restart={"retries_per_rung": 1, "backoff_jitter": 0.0, "backoff_max_s": 1.5, "failed_cooldown_s": 0},
    )
    poison(s.state_dir, marker="0123abcd", current="base", consecutive_failures=1100, failures_on_current=0)
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "failed", 60, "failed after one retry")
    decisions = [e for e in events(s.state_dir) if e["event"] == "ladder_decision"]
    assert decisions[0]["action"] == "relaunch" and decisions[0]["backoff_s"] == pytest.approx(1.5)
    assert r.snap().loop_errors == 0


async def test_state_json_is_never_left_torn(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")
    doc = json.loads((s.state_dir / "state.json").read_text())
    assert doc["marker"] == marker_of(r.snap().pid) and doc["current"] == "base"
    assert [p.name for p in s.state_dir.iterdir() if p.name.endswith(".tmp")] == []
