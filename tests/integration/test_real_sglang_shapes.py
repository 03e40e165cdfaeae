"""The daemon against what real SGLang 0.5.16 did that older simulators did not (REAL_SGLANG.md):
a long silent import with untitled children, and a SIGSTOPped scheduler under load."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil
import pytest
from test_serving_watchdog import ready, traffic

pytestmark = pytest.mark.integration


async def test_a_long_silent_import_is_spawning_not_a_stall(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    # 2 s in main, then 8 s in every child, no log line: twice the 4 s stall window.
    s = sim("ok", tp=1, env={"SGLANG_SIM_IMPORT_S": "8"}, args={"disable-piecewise-cuda-graph": True})
    r = await daemon(s)
    snap = await r.wait_for(lambda x: any(p.role == "pending" for p in x.processes), 20, "children importing")
    assert snap.state == "starting" and snap.phase == "spawning"
    assert not any(p.role == "other" and "spawn_main" in p.title for p in snap.processes)
    during = await r.wait_for(lambda x: x.last_progress_s is not None and bool(x.channels_moved), 10, "moving")
    assert set(during.channels_moved) & {"io", "rss"}, during.channels_moved  # strong channels, not CPU alone
    snap = await r.wait_for(ready, 60, "ready after the import")
    assert snap.last_incident is None and snap.restarts == 0
    roles = sorted((p.role, p.rank) for p in snap.processes if p.role in ("scheduler", "detokenizer"))
    assert roles == [("detokenizer", None), ("scheduler", 0)]  # `sglang::scheduler`, no _TP0 at tp 1


async def test_a_sigstopped_scheduler_under_load(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok", tp=1, restart={"retries_per_rung": 2}))
    snap = await r.wait_for(ready, 40, "ready")
    scheduler = next(p.pid for p in snap.processes if p.role == "scheduler")
    async with traffic(r.settings.server.port, concurrency=3):
        await r.wait_for(lambda x: (x.serving.running_reqs or 0) > 0, 20, "requests running")
        os.kill(scheduler, signal.SIGSTOP)
        snap = await r.wait_for(lambda x: x.last_incident is not None and x.last_incident.bundle, 40, "incident")
    incident = snap.last_incident
    assert incident is not None and incident.cause in ("serving_stall", "unhealthy")
    assert incident.hang_class != "busy_spin", incident  # the HTTP front end's core does not decide it
    bundle = Path(r.settings.paths.state_dir) / "diagnostics" / str(incident.bundle)
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["stopped"] == [scheduler]
    assert summary["reasons"][0].startswith(f"scheduler TP0 pid {scheduler} stopped (state T")
    snap = await r.wait_for(lambda x: x.state == "ready" and x.restarts >= 1, 60, "relaunched and ready")
    assert not psutil.pid_exists(scheduler) or psutil.Process(scheduler).status() == psutil.STATUS_ZOMBIE
    assert snap.serving.health_ok is not False  # nothing carried over from the stopped server
