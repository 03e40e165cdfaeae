"""Starvation is not a stall (issue 32), through the running daemon and the simulator.

The simulated server's tree is pinned to one CPU beside CPU hogs (os.sched_setaffinity) during a
silent compile longer than the stall window: it gets a seventh of a core, under the CPU-progress
threshold, so no channel moves; its run-queue wait grows and the window is extended. A deadlocked
tree pinned beside the same hogs is still judged within the window: blocked threads wait for no CPU.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from hostload import ALL, CPU, hogs, pin_tree
from serving import SPEC

pytestmark = pytest.mark.integration

WINDOW = 2.0
COMPILE_S = 6.0  # three stall windows of silence; under the 1 + 4 windows the ceiling allows


def fake_gpu(tmp_path: Path) -> Path:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"devices": [{"util": 0, "mem_used": 1 << 30, "gpm": {"sm_util": 0.0}}]}))
    return path


async def test_a_starved_silent_compile_is_not_judged_stalled(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        "long_compile",
        tp=1,
        env={"SGLANG_SIM_COMPILE_S": str(COMPILE_S)},
        args=SPEC,
        watchdog={"startup_stall_s": WINDOW, "cpu_only_stall_s": 60.0},
        gpu=fake_gpu(tmp_path),
    )
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.phase == "capturing_graphs", 60, "graph capture (the compile comes next)")
    assert snap.pid is not None
    reasons: list[str] = []
    with hogs():
        until = time.monotonic() + COMPILE_S + 2.0
        while time.monotonic() < until:
            assert pin_tree(snap.pid, {CPU}) > 0
            now = r.snap()
            assert now.last_incident is None, now.last_incident
            reasons.append(now.reason)
            await asyncio.sleep(0.2)
    pin_tree(snap.pid, ALL)
    snap = await r.wait_for(lambda x: x.state == "ready" or x.last_incident is not None, 60, "ready")
    assert snap.last_incident is None, snap.last_incident
    assert snap.state == "ready"
    # While it waited, the daemon said why it did not judge it, and by how much.
    held = [x for x in reasons if "window extended by" in x and "waited" in x]
    assert held, reasons[-5:]


async def test_a_deadlocked_tree_beside_the_same_hogs_is_still_judged(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    onset_file = tmp_path / "onset.json"
    s = sim(
        "deadlock_after_load",
        tp=1,
        env={"SGLANG_SIM_ONSET_FILE": str(onset_file)},
        watchdog={"startup_stall_s": WINDOW},
    )
    r = await daemon(s)
    snap = await r.wait_for(lambda _: onset_file.exists(), 60, "the deadlock's onset")
    assert snap.pid is not None
    with hogs():
        pin_tree(snap.pid, {CPU})
        await r.wait_for(lambda x: x.state in ("hung", "diagnosing", "restarting"), 30, "the stall verdict")
        late = time.monotonic() - float(json.loads(onset_file.read_text())["onset_monotonic"])
    snap = await r.wait_for(lambda x: x.last_incident is not None, 30, "the startup_stall incident")
    inc = snap.last_incident
    assert inc is not None and inc.cause == "startup_stall" and inc.hang_class == "idle_deadlock", inc
    # The tree waited (nearly) nothing for a CPU: at most a second's worth extended the window.
    waited = re.search(r"the tree waited ([\d.]+) s", inc.detail)
    assert waited is None or float(waited.group(1)) < 1.0, inc.detail
    # Judged within the window and a few polls, plus whatever the daemon's own late polls added.
    lag = re.search(r"poll was ([\d.]+) s late", inc.detail)
    allowed = WINDOW + 3 * s.watchdog.poll_interval_s + 1.0 + (float(lag.group(1)) if lag else 0.0)
    assert late <= allowed, (late, inc.detail)
