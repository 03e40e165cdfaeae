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


LADDER3 = [
    {"name": "smaller-graphs", "args": {"cuda-graph-max-bs": 8}},
    {"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}},
]


async def test_a_failed_promote_goes_straight_back_to_the_rung_that_served(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    """Issue 49: the operator promotes while the preferred rung's cause persists (it deadlocks after
    the load unless --disable-cuda-graph): base is tried once, then no-cuda-graph is relaunched at
    once. Two launches, no backoff, no walk down smaller-graphs (before: 4 failed launches)."""
    s = sim(
        "deadlock_after_load",
        env={"SGLANG_SIM_UNLESS": "disable-cuda-graph"},
        restart={**FAST, "backoff_initial_s": 3.0, "retries_per_rung": 1, "failed_cooldown_s": 0},
        fallback=LADDER3,
    )
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "ready" and x.rung == "no-cuda-graph", 120, "serving on no-cuda-graph")
    before = len(named(s.paths.state_dir, "server_launched"))
    async with httpx.AsyncClient() as c:
        res = await c.post(f"{r.api}/promote", json={})
    assert res.status_code == 202, res.text
    assert "if it fails before it serves: back to no-cuda-graph" in res.json()["message"]
    await r.wait_for(
        lambda x: x.state == "ready" and len(named(s.paths.state_dir, "server_launched")) > before + 1,
        90,
        "back on no-cuda-graph after the promote",
    )
    launched = [e["rung"] for e in named(s.paths.state_dir, "server_launched")][before:]
    assert launched == ["base", "no-cuda-graph"], launched
    decisions = named(s.paths.state_dir, "ladder_decision")
    back = decisions[-1]
    assert (back["rung"], back["backoff_s"]) == (2, 0.0) and "back to rung no-cuda-graph" in back["reason"]
    snap = await r.wait_for(lambda x: x.state == "ready", 10, "ready")
    assert snap.rung == "no-cuda-graph"


async def test_a_rung_that_served_keeps_its_standing_after_an_unrelated_fault(daemon, sim, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 49: base serves, then crashes once (a fault its configuration does not cause): it is
    relaunched on base at once, spending no retry, even with retries_per_rung = 0 (before: stepped
    down to no-cuda-graph after the backoff)."""
    s = sim(
        "crash_after_ready",
        env={
            "SGLANG_SIM_FAULT_AFTER_S": "1.0",
            "SGLANG_SIM_FAULT_ONCE": "1",
            "SGLANG_SIM_ONSET_FILE": str(tmp_path / "onset.json"),  # the fault's once (the bench's file)
        },
        restart={**FAST, "backoff_initial_s": 3.0, "retries_per_rung": 0, "failed_cooldown_s": 0},
        fallback=[{"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}],
    )
    r = await daemon(s)
    await r.wait_for(lambda x: x.restarts >= 1 and x.state == "ready", 90, "serving again after the crash")
    assert [e["rung"] for e in named(s.paths.state_dir, "server_launched")] == ["base", "base"]
    decision = named(s.paths.state_dir, "ladder_decision")[0]
    assert decision["backoff_s"] == 0.0 and "keeps its standing" in decision["reason"], decision


async def test_an_unhealthy_outage_counts_from_the_first_failed_health_check(daemon, sim, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 49: the outage record of an `unhealthy` incident begins at the first failed health check,
    so its total matches what clients saw (fault onset to serving again) within a health interval and
    a poll; before, its detection was 0.0 and the total was short by the checks that failed."""
    import contextlib
    import json
    import time
    from pathlib import Path
    from typing import Any

    onset_file = Path(tmp_path) / "onset.json"
    s = sim(
        "health_hangs",
        env={"SGLANG_SIM_FAULT_AFTER_S": "1.0", "SGLANG_SIM_FAULT_ONCE": "1", "SGLANG_SIM_ONSET_FILE": str(onset_file)},
        restart={**FAST, "failed_cooldown_s": 0},
    )
    r = await daemon(s)
    onsets: list[float] = []

    def served_again(x: Any) -> bool:  # the relaunch (fault once) rewrites the file with no onset: keep the first
        with contextlib.suppress(OSError, ValueError):
            at = json.loads(onset_file.read_text()).get("onset_monotonic")
            if at is not None and not onsets:
                onsets.append(float(at))
        return x.restarts >= 1 and x.state == "ready"

    await r.wait_for(served_again, 90, "serving again after the hang")
    ready_at = time.monotonic()
    onset = onsets[0]
    (outage,) = named(s.paths.state_dir, "outage")
    assert outage["cause"] == "unhealthy" and outage["parts"]["detection"] > 0.0, outage
    clients = ready_at - onset
    slack = s.watchdog.health_interval_s + s.watchdog.poll_interval_s
    assert abs(outage["total_s"] - clients) <= slack + 0.5, (outage, clients)
