"""Recovery as documented, through the running daemon: retries, first backoff, `failed_cooldown_s`,
fresh counters out of `failed`."""

from __future__ import annotations

import httpx
import pytest
from statedir import events, named

pytestmark = pytest.mark.integration


FAST = {"backoff_initial_s": 0.4, "backoff_max_s": 5.0, "backoff_jitter": 0.0, "max_restarts_per_hour": 50}


async def test_one_retry_of_a_single_rung_with_the_initial_backoff(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("crash_on_load", restart={**FAST, "retries_per_rung": 1, "failed_cooldown_s": 0})
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.state == "failed", 40, "failed after one retry")
    assert [e["rung"] for e in named(s.paths.state_dir, "server_launched")] == ["base", "base"]
    decisions = named(s.paths.state_dir, "ladder_decision")
    assert [d["action"] for d in decisions] == ["relaunch", "give_up"]
    assert decisions[0]["backoff_s"] == pytest.approx(0.4), "the first backoff is backoff_initial_s"
    assert snap.restarts == 1 and "exhausted" in snap.reason
    assert snap.next_attempt_in_s is None, "failed_cooldown_s = 0 waits for an operator"


async def test_transient_fault_is_retried_on_its_rung_not_moved_down(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        "crash_after_ready",
        env={"SGLANG_SIM_FAULT_AFTER_S": "1.0"},
        restart={**FAST, "retries_per_rung": 2, "failed_cooldown_s": 0},
        fallback=[{"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}],
    )
    r = await daemon(s)
    await r.wait_for(lambda x: x.restarts >= 1 and x.state in ("starting", "ready"), 40, "relaunched once")
    launched = [e["rung"] for e in named(s.paths.state_dir, "server_launched")]
    assert launched[:2] == ["base", "base"], launched


async def test_failed_starts_again_after_the_cooldown_with_fresh_counters(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("crash_on_load", restart={**FAST, "retries_per_rung": 1, "failed_cooldown_s": 1.0})
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.state == "failed", 40, "failed")
    assert snap.next_attempt_in_s is not None and 0 < snap.next_attempt_in_s <= 1.0
    await r.wait_for(lambda _: len(named(s.paths.state_dir, "failed_cooldown_over")) >= 2, 60, "two cooldowns")
    ev = events(s.paths.state_dir)
    over = [i for i, e in enumerate(ev) if e["event"] == "failed_cooldown_over"]
    after_first = [e for e in ev[over[0] :] if e["event"] == "ladder_decision"]
    assert [d["action"] for d in after_first[:2]] == ["relaunch", "give_up"], "the retry count starts afresh"
    assert after_first[0]["backoff_s"] == pytest.approx(0.4), "the backoff starts afresh"
    assert any(e["event"] == "server_launched" for e in ev[over[0] : over[1]])
    assert all(e["rung"] == "base" for e in ev if e["event"] == "failed_cooldown_over")


async def test_manual_start_out_of_failed_has_fresh_counters(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("crash_on_load", restart={**FAST, "retries_per_rung": 2, "failed_cooldown_s": 0})
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "failed", 40, "failed")
    before = len(named(s.paths.state_dir, "ladder_decision"))
    async with httpx.AsyncClient() as c:
        res = await c.post(f"{r.api}/start", json={})
    assert res.status_code == 202, res.text
    await r.wait_for(
        lambda _: len(named(s.paths.state_dir, "ladder_decision")) > before, 30, "an incident after the manual start"
    )
    first = named(s.paths.state_dir, "ladder_decision")[before]
    assert first["action"] == "relaunch" and first["backoff_s"] == pytest.approx(0.4)
    assert "retry 1/2" in first["reason"]
    assert named(s.paths.state_dir, "failed_left")
