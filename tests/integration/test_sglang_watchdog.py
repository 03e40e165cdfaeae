"""SGLang's own watchdog fires before the daemon's window: the incident says so, SGLang's py-spy dump
is kept in the bundle, and the hang is a stall, not a crash (issue 22)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from serving import traffic

pytestmark = pytest.mark.integration

VENV_BIN = str(Path(sys.executable).parent)  # where py-spy is, for the server's own dump


async def _fired(daemon, sim, path: str):  # type: ignore[no-untyped-def]
    s = sim(
        "serving_stall",
        env={"PATH": path},
        args={"watchdog-timeout": 2},
        watchdog={"serving_stall_s": 30.0, "metrics_interval_s": 1.0},
    )
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    async with traffic(s.server.port, concurrency=2):
        snap = await r.wait_for(lambda x: x.last_incident is not None and x.last_incident.bundle, 40, "incident")
    inc = snap.last_incident
    assert inc is not None
    bundle = Path(s.paths.state_dir) / "diagnostics" / str(inc.bundle)
    return inc, bundle


async def test_sglangs_watchdog_is_a_serving_stall_with_its_dump_kept(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    inc, bundle = await _fired(daemon, sim, f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    assert inc.cause == "serving_stall", inc  # well before serving_stall_s (30 s): SGLang judged it
    assert "SGLang's own watchdog fired (Scheduler watchdog timeout after 2 s)" in inc.detail
    assert "py-spy dump of 1 process" in inc.detail
    kept = (bundle / "sglang-watchdog.txt").read_text()
    assert "Scheduler watchdog timeout (self.watchdog_timeout=2.0, self.soft=False)" in kept
    assert "Pyspy dump for PID" in kept and 'Thread ' in kept
    assert "Pyspy dump for PID" in (bundle / "log-tail.txt").read_text()
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["sglang_watchdog"].startswith("Scheduler watchdog timeout")
    assert "SGLang's own watchdog fired" in (bundle / "summary.txt").read_text()


async def test_without_py_spy_in_the_servers_path_the_failure_is_said(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    inc, bundle = await _fired(daemon, sim, "/usr/bin:/bin")
    assert inc.cause == "serving_stall" and "its py-spy failed" in inc.detail, inc.detail
    assert "logged no py-spy dump" in (bundle / "sglang-watchdog.txt").read_text()
