"""The one owner through the running daemon: a backoff is a pending timer, and a command that
arrives while it waits goes through the same dispatcher as any other (issue 25)."""

from __future__ import annotations

import asyncio
from datetime import datetime

import httpx
import pytest
from statedir import named

pytestmark = pytest.mark.integration


LONG = {"backoff_initial_s": 8.0, "backoff_max_s": 30.0, "backoff_jitter": 0.0, "max_restarts_per_hour": 50}


async def test_a_stop_during_the_backoff_stops_the_wait(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("crash_on_load", restart={**LONG, "retries_per_rung": 3, "failed_cooldown_s": 0})
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.state == "restarting" and x.next_attempt_in_s, 40, "the backoff")
    assert snap.pid is None
    left = snap.next_attempt_in_s
    async with httpx.AsyncClient(timeout=10) as c:
        res = await c.post(f"{r.api}/stop", json={"reason": "maintenance"})
    assert res.status_code == 202, res.text
    assert res.json()["message"] == "stopped", "answered by the stop's handler: nothing ran to stop"
    snap = await r.wait_for(lambda x: x.state == "stopped", 10, "stopped")
    assert snap.reason == "maintenance" and snap.next_attempt_in_s is None
    await asyncio.sleep((left or 0) + 1.0)  # past the old deadline: nothing launches
    assert r.snap().state == "stopped"
    assert len(named(s.paths.state_dir, "server_launched")) == 1
    assert [c["kind"] for c in named(s.paths.state_dir, "command")] == ["stop"], "journalled like any command"


async def test_a_start_during_the_backoff_launches_now_on_the_decided_rung(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        "crash_on_load",
        restart={
            **LONG,
            "backoff_initial_s": 60.0,
            "backoff_max_s": 120.0,
            "retries_per_rung": 0,
            "failed_cooldown_s": 0,
        },
        fallback=[{"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}],
    )
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.state == "restarting" and x.next_attempt_in_s, 40, "the backoff")
    assert snap.next_attempt_in_s is not None and snap.next_attempt_in_s > 30
    decided = named(s.paths.state_dir, "ladder_decision")[-1]
    assert decided["action"] == "relaunch" and decided["rung"] == 1
    async with httpx.AsyncClient(timeout=10) as c:
        res = await c.post(f"{r.api}/start", json={})
    assert res.status_code == 202, res.text
    await r.wait_for(lambda _: len(named(s.paths.state_dir, "server_launched")) == 2, 15, "the relaunch, now")
    assert [e["rung"] for e in named(s.paths.state_dir, "server_launched")] == ["base", "no-cuda-graph"]
    assert [c["kind"] for c in named(s.paths.state_dir, "command")] == ["start"]


async def test_the_daemon_keeps_polling_while_a_backoff_waits(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    """No loop waits inside a helper: the status keeps moving and the API answers during the wait."""
    s = sim("crash_on_load", restart={**LONG, "backoff_initial_s": 6.0, "retries_per_rung": 3, "failed_cooldown_s": 0})
    r = await daemon(s)
    first = await r.wait_for(lambda x: x.state == "restarting" and x.next_attempt_in_s, 40, "the backoff")
    assert first.next_attempt_in_s is not None
    later = await r.wait_for(
        lambda x: x.state == "restarting" and (x.next_attempt_in_s or 99) < first.next_attempt_in_s - 1,
        10,
        "a countdown",
    )
    assert later.state_age_s > first.state_age_s
    async with httpx.AsyncClient(timeout=5) as c:
        assert (await c.get(f"{r.api}/status")).json()["state"] == "restarting"
    await r.wait_for(lambda _: len(named(s.paths.state_dir, "server_launched")) >= 2, 20, "the relaunch")
    # The backoff counts from the verdict (issue 36): the move to `restarting` follows it at once here
    # (an exit: no evidence), and the stop that came after it is part of the wait.
    moves = [e for e in named(s.paths.state_dir, "state_changed") if e["new"] == "restarting"]
    judged = datetime.fromisoformat(moves[0]["ts"].replace("Z", "+00:00"))
    decided = datetime.fromisoformat(named(s.paths.state_dir, "ladder_decision")[0]["ts"].replace("Z", "+00:00"))
    second = datetime.fromisoformat(named(s.paths.state_dir, "server_launched")[1]["ts"].replace("Z", "+00:00"))
    assert (second - judged).total_seconds() >= 6.0 - 0.1, "the timer waited out the backoff"
    assert (second - decided).total_seconds() >= 6.0 - 0.1 - (decided - judged).total_seconds()
