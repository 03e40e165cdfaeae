"""A ready server watched the way SGLang really fails: health, stalls with /health 200, dead ranks,
crashes and speculative regressions; and steady traffic or an idle server left alone."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from serving import SPEC, ready, traffic

pytestmark = pytest.mark.integration

async def test_health_hangs_is_unhealthy(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    # A hung scheduler freezes SGLang's gauges: if a health probe's request was running at that moment,
    # `num_running_reqs` stays 1 and a serving stall is an equally true verdict. This test is about the
    # health channel, so the serving-stall window is kept out of its way.
    r = await daemon(sim("health_hangs", watchdog={"serving_stall_s": 30.0}))
    await r.wait_for(ready, 30, "ready")
    snap = await r.wait_for(lambda s: s.last_incident is not None, 30, "unhealthy")
    assert snap.last_incident is not None and snap.last_incident.cause == "unhealthy"


async def test_serving_stall_caught_while_health_says_200(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("serving_stall")
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    health: list[tuple[bool | None, int | None]] = []  # the health /status showed through the stall

    def stalled(x: Any) -> bool:
        if x.serving.health_status is not None:
            health.append((x.serving.health_ok, x.serving.health_status))
        return x.last_incident is not None

    async with traffic(s.server.port, concurrency=3):
        snap = await r.wait_for(stalled, 30, "serving stall")
    assert snap.last_incident is not None and snap.last_incident.cause == "serving_stall"
    # /health kept answering 200 through the stall: the verdict came from token progress.
    assert health and health[-1] == (True, 200), health[-5:]


async def test_serving_stall_with_the_scheduler_gauges_at_zero(daemon, sim, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Real SGLang at tp 2: the stall followed a prefill of new requests, so the scheduler's gauges
    froze at 0 running, 0 queued. The HTTP front's open requests still make it a stall."""
    onset = tmp_path / "onset.json"
    s = sim("serving_stall", env={"SGLANG_SIM_ONSET_FILE": str(onset)})
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    await r.wait_for(lambda _: onset.exists() and onset.read_text().strip() != "", 30, "the stall begins")
    async with traffic(s.server.port, concurrency=1):  # one request, admitted after the stall began
        snap = await r.wait_for(lambda x: x.last_incident is not None, 30, "serving stall")
    assert snap.last_incident is not None and snap.last_incident.cause == "serving_stall"
    assert "0 running and 0 queued requests (1 open at the HTTP front)" in snap.last_incident.detail


async def test_rank_death_is_caught_at_the_next_poll(daemon, sim, tmp_path) -> None:  # type: ignore[no-untyped-def]
    onset_file = tmp_path / "onset.json"
    s = sim("rank_dies", tp=2, env={"SGLANG_SIM_ONSET_FILE": str(onset_file)})
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    await r.wait_for(lambda x: x.state in ("hung", "diagnosing", "restarting"), 20, "rank_died verdict")
    late = time.monotonic() - json.loads(onset_file.read_text())["onset_monotonic"]
    assert late <= 2 * s.watchdog.poll_interval_s + 0.3, f"{late:.2f} s after the rank died"
    snap = await r.wait_for(lambda x: x.last_incident is not None, 20, "rank_died")
    assert snap.last_incident is not None and snap.last_incident.cause == "rank_died"


async def test_the_only_rank_dying_is_no_hang_class(daemon, sim, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """tp 1: the scheduler is gone and only the front end burns its core. On the H200 that core made
    the bundle say `busy_spin`; nothing is left to judge, so the class is `unknown`, and says why."""
    s = sim("rank_dies", tp=1)
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    snap = await r.wait_for(lambda x: x.last_incident is not None, 30, "rank_died")
    inc = snap.last_incident
    assert inc is not None and inc.cause == "rank_died" and inc.bundle is not None
    assert inc.hang_class == "unknown"
    summary = json.loads((Path(s.paths.state_dir) / "diagnostics" / inc.bundle / "summary.json").read_text())
    assert summary["hang_class"] == "unknown"
    assert any("no scheduler is left" in why for why in summary["reasons"]), summary["reasons"]


async def test_crash_after_ready_is_exited_and_restarted(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("crash_after_ready", restart={"retries_per_rung": 3}))
    await r.wait_for(ready, 30, "ready")
    snap = await r.wait_for(lambda x: x.last_incident is not None, 20, "exited")
    # SGLang 0.5.16: the failed rank exits and main lives on through its crash diagnostics (a 5 s
    # sleep, then a coredump wait while the other rank lives), so the next poll sees a dead rank.
    assert snap.last_incident is not None and snap.last_incident.cause in ("rank_died", "exited")
    await r.wait_for(lambda x: x.state in ("starting", "ready") and x.restarts >= 1, 20, "relaunched")


async def test_low_acceptance_under_traffic_degrades_then_falls_back(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        "low_accept",
        args=SPEC,
        watchdog={"on_spec_regression": "fallback"},
        fallback=[{"name": "no-speculation", "drop": list(SPEC)}],
    )
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    async with traffic(s.server.port):
        snap = await r.wait_for(lambda x: x.last_incident is not None, 40, "spec regression")
    inc = snap.last_incident
    assert inc is not None and inc.cause == "spec_regression" and inc.bundle is not None
    # Only hangs get hang classes (issue 32): its bundle says what it was captured for, no shape.
    assert inc.hang_class is None
    bundle = Path(s.paths.state_dir) / "diagnostics" / inc.bundle
    got = json.loads((bundle / "summary.json").read_text())
    assert got["hang_class"] is None and got["candidates"] == []
    assert got["captured_for"].startswith("captured for spec_regression: speculative acceptance length")
    assert isinstance(got["wait_kinds"], dict) and got["wait_kinds"]  # the threads are still evidence
    assert "Hang class: none (not a hang: captured for spec_regression" in (bundle / "summary.txt").read_text()
    snap = await r.wait_for(lambda x: x.rung == "no-speculation" and x.state == "ready", 30, "no-spec rung ready")


async def test_low_acceptance_alert_only_is_degraded(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("low_accept", args=SPEC)
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    async with traffic(s.server.port):
        snap = await r.wait_for(lambda x: x.state == "degraded", 40, "degraded on acceptance")
    assert "acceptance" in snap.reason
    assert snap.serving.spec_accept_length is not None and snap.serving.spec_accept_length < 1.5
    assert snap.restarts == 0


async def test_steady_traffic_with_slow_health_and_idle_gauges_stay_ready(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", args=SPEC, env={"SGLANG_SIM_HEALTH_LATENCY_S": "1.0"})
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    windows = 3 * s.watchdog.serving_stall_s
    async with traffic(s.server.port) as done:
        for _ in range(int(windows * 10)):
            assert r.snap().state == "ready", r.snap().reason
            await asyncio.sleep(0.1)
    assert len(done) > 5, "the load generator really got answers"
    assert r.snap().serving.health_ok is True and (r.snap().serving.health_latency_s or 0) >= 0.9
    # Then idle, with frozen gauges, for more than a stall window.
    for _ in range(int(s.watchdog.serving_stall_s * 1.5 * 10)):
        assert r.snap().state == "ready", r.snap().reason
        await asyncio.sleep(0.1)
    assert r.snap().last_incident is None and r.snap().incidents == 0
