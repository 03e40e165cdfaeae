"""The heart of the project: silent start-up deadlocks caught from progress, long loads left alone."""

from __future__ import annotations

import asyncio
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


WINDOWS = 5  # stall windows each load is watched for


@pytest.mark.parametrize(
    "scenario,env",
    [
        ("quiet_load", {"SGLANG_SIM_QUIET_S": "30"}),  # no log line at all while it reads and computes
        ("slow_load", {"SGLANG_SIM_SHARD_S": "6"}),  # one shard every 6 s: 3 stall windows per shard
    ],
)
async def test_long_quiet_or_slow_loads_are_never_judged_stalled(daemon, sim, scenario, env) -> None:  # type: ignore[no-untyped-def]
    s = sim(scenario, env=env, watchdog={"startup_stall_s": 2.0, "cpu_only_stall_s": 4.0})
    r = await daemon(s)
    seen: set[str] = set()
    for _ in range(int(WINDOWS * s.watchdog.startup_stall_s * 10)):
        snap = r.snap()
        assert snap.last_incident is None, snap.last_incident
        assert snap.state == "starting", snap.reason
        seen.update(snap.channels_moved)
        await asyncio.sleep(0.1)
    snap = r.snap()
    assert snap.phase == "loading_weights"
    assert "io" in seen, f"the load was seen reading: {seen}"
    if scenario == "slow_load":
        assert snap.progress is not None and snap.progress.unit == "shards" and snap.progress.total > 0
    else:
        assert "log" not in seen or snap.progress is None


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
