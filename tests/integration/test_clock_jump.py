"""Issue 50: a +1 h jump of the daemon's clocks during a start tripped the `startup_timeout`
backstop at once. The machine's clock cannot be moved by a test, so the daemon runs in this process
(supervisor.root.inprocess) with a clock that reads the system's and jumps when told to; the server is
the simulator, a real child process, loading its shards slowly."""

from __future__ import annotations

import time

import pytest

import supervisor.root.serve as serve_module
from supervisor.clock import SystemClock
from supervisor.process import kill_marked
from supervisor.root.inprocess import start_in_process

pytestmark = pytest.mark.integration


class JumpingClock(SystemClock):
    """The system's clocks, both moved by `jump` seconds (as a VM paused for an hour, or faketime)."""

    offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + JumpingClock.offset

    def wall(self) -> float:
        return time.time() + JumpingClock.offset


async def test_an_hour_jump_of_both_clocks_during_a_start_is_no_verdict(sim, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(JumpingClock, "offset", 0.0)
    monkeypatch.setattr(serve_module, "SystemClock", JumpingClock)
    # One shard a second for 33 s; the backstop at 60 s (so an hour's jump is far past it) and a stall
    # window of 10 s, longer than the ten poll intervals (5 s) a single slow poll is counted for.
    s = sim(
        "slow_load",
        tp=1,
        env={"SGLANG_SIM_SHARD_S": "1"},
        watchdog={"startup_stall_s": 10.0, "cpu_only_stall_s": 20.0, "startup_timeout_s": 60.0},
    )
    d = await start_in_process(s)
    try:
        await d.wait_for(lambda x: x.phase == "loading_weights" and x.progress is not None, 40, "loading shards")
        JumpingClock.offset += 3600.0
        snap = await d.wait_for(lambda x: x.state == "ready" or x.last_incident is not None, 120, "ready")
        assert snap.last_incident is None and snap.state == "ready", (snap.state, snap.reason, snap.last_incident)
        assert snap.restarts == 0
    finally:
        if not d.task.done():
            await d.stop(timeout=60)
        kill_marked(d.marker, grace_s=0.5)
