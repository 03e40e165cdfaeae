"""The daemon against what real SGLang 0.5.16 did that older simulators did not (REAL_SGLANG.md):
a long silent import with untitled children, and a SIGSTOPped scheduler under load."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil
import pytest
from serving import ready, traffic

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


async def test_cuda_gdb_reads_no_library_symbols_where_py_spy_named_the_frames(  # type: ignore[no-untyped-def]
    daemon, sim, tmp_path
) -> None:
    """As on the H200 (the image has only cuda-gdb): the scheduler's attach skips the libraries'
    symbols once py-spy --native has its host frames (8.3 s -> 0.6 s per attach there)."""
    cuda_gdb = tmp_path / "bin" / "cuda-gdb"
    cuda_gdb.parent.mkdir()
    cuda_gdb.write_text(
        "#!/bin/sh\necho '#0  0x00007f0000000000 in __futex_abstimed_wait_common64 () from /lib/libc.so.6'\n"
    )
    cuda_gdb.chmod(0o755)
    diagnostics = {"native": True, "gdb": "on_hang", "gdb_path": str(cuda_gdb)}
    r = await daemon(sim("deadlock_after_load", tp=1, diagnostics=diagnostics))
    snap = await r.wait_for(lambda x: x.last_incident is not None and x.last_incident.bundle, 40, "incident")
    assert snap.last_incident is not None and snap.last_incident.cause == "startup_stall"
    bundle = Path(r.settings.paths.state_dir) / "diagnostics" / str(snap.last_incident.bundle)
    summary = json.loads((bundle / "summary.json").read_text())
    (sched,) = [p["pid"] for p in summary["pids"] if p["role"] == "scheduler"]
    ran = {(t["pid"], t["tool"]): t["outcome"] for t in summary["tools"]}
    assert ran[(sched, "py-spy-native")] == "ok" and ran[(sched, "cuda-gdb")] == "ok", summary["tools"]
    header = (bundle / f"gdb-{sched}.txt").read_text().splitlines()[0]
    assert str(cuda_gdb) in header and "set auto-solib-add off" in header and "info cuda kernels" in header
