"""The heart of the project: silent start-up deadlocks caught from progress, long loads left alone."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def onset(path: Path) -> float:
    return float(json.loads(path.read_text())["onset_monotonic"])


async def test_deadlock_after_load_is_a_startup_stall_within_the_window(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    onset_file = tmp_path / "onset.json"
    s = sim("deadlock_after_load", env={"SGLANG_SIM_ONSET_FILE": str(onset_file)})
    r = await daemon(s)
    await r.wait_for(lambda x: x.state in ("hung", "diagnosing", "restarting"), 30, "the stall verdict")
    detected = time.monotonic()
    late = detected - onset(onset_file)
    window = s.watchdog.startup_stall_s + 2 * s.watchdog.poll_interval_s
    assert late <= window + 0.3, f"detected {late:.2f} s after the onset; window {window} s"
    assert late >= s.watchdog.startup_stall_s - 0.5, "judged before the stall window passed"
    snap = await r.wait_for(lambda x: x.last_incident is not None, 30, "a startup_stall incident")
    inc = snap.last_incident
    assert inc is not None and inc.cause == "startup_stall"
    assert inc.hang_class == "idle_deadlock"
    # Detected within the stall window plus two polls of the moment progress stopped.
    events = [json.loads(x) for x in (Path(s.paths.state_dir) / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "incident" and e["cause"] == "startup_stall" for e in events)
    hung_at = next(e for e in events if e["event"] == "state_changed" and e["new"] == "hung")
    assert "phase" in hung_at["reason"] and "idle" in hung_at["reason"]
    assert "loading_weights" not in hung_at["reason"]  # it stalled after the load


async def test_quiet_and_slow_loads_are_never_judged_stalled(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    quiet = await daemon(sim("quiet_load", env={"SGLANG_SIM_QUIET_S": "30"}))
    await asyncio.sleep(0.5)
    seen_progress = False
    for _ in range(5 * 4 * 10):  # five 4-second stall windows
        s = quiet.snap()
        assert s.last_incident is None, s.last_incident
        assert s.state in ("starting", "ready")
        await asyncio.sleep(0.1)
    assert "io" in quiet.sup.history.moved_at or quiet.snap().state == "ready"  # type: ignore[union-attr]
    await quiet.stop()

    slow = await daemon(sim("slow_load", env={"SGLANG_SIM_SHARD_S": "6"}))
    for _ in range(5 * 4 * 10):
        s = slow.snap()
        assert s.last_incident is None, s.last_incident
        if s.progress is not None and s.progress.unit == "shards":
            seen_progress = True
        await asyncio.sleep(0.1)
    assert seen_progress, "the shard progress bar shows in /status"
    assert slow.snap().phase == "loading_weights"


async def test_busy_hang_after_load_is_busy(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("busy_hang_after_load"))
    snap = await r.wait_for(lambda x: x.last_incident is not None, 40, "busy incident")
    assert snap.last_incident is not None
    assert snap.last_incident.cause == "startup_stall"
    assert snap.last_incident.hang_class == "busy_spin"


async def test_crash_on_load_restarts_with_growing_delays(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        "crash_on_load",
        restart={
            "retries_per_rung": 10,
            "backoff_initial_s": 0.3,
            "backoff_max_s": 5.0,
            "backoff_jitter": 0.0,
            "max_restarts_per_hour": 4,
        },
    )
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.state == "failed", 40, "failed after the restart budget")
    assert snap.restarts == 4 and "budget" in snap.reason
    events = [json.loads(x) for x in (Path(s.paths.state_dir) / "events.jsonl").read_text().splitlines()]
    delays = [e["backoff_s"] for e in events if e["event"] == "ladder_decision" and e["action"] == "relaunch"]
    assert delays == sorted(delays) and delays[-1] > delays[0]
    assert all(e["cause"] == "exited" for e in events if e["event"] == "incident")
    # The API still answers in `failed`.
    import httpx

    async with httpx.AsyncClient() as c:
        assert (await c.get(f"{r.api}/status")).json()["state"] == "failed"
