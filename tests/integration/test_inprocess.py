"""The daemon embedded in a program's event loop (supervisor.root.inprocess, what the benchmarks
use): it starts, serves its status, takes commands, stops its server on the way out, and says why
when it cannot start."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.host.instance_lock import StateDirLocked
from supervisor.process import kill_marked
from supervisor.root.inprocess import Command, start_in_process

pytestmark = pytest.mark.integration


async def test_start_status_commands_and_stop(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    d = await start_in_process(s)
    try:
        assert d.marker and d.settings is s
        ready = await d.wait_for(lambda x: x.state == "ready", 40, "ready")
        result = await d.submit(Command(kind="restart", reason="bench"))
        assert result.outcome == "accepted" and result.incident_id
        again = await d.wait_for(lambda x: x.state == "ready" and x.pid != ready.pid, 40, "ready again")
        assert again.last_incident is not None and again.last_incident.id == result.incident_id
        with pytest.raises(TimeoutError, match="no the impossible within 0 s; last state ready"):
            await d.wait_for(lambda x: False, 0.2, "the impossible")
        assert await d.stop(timeout=60) == 0
        assert d.snapshot().state == "stopped"
    finally:
        if not d.task.done():
            d.task.cancel()
        kill_marked(d.marker, grace_s=0.5)


async def test_a_second_daemon_on_the_same_state_dir_is_refused(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    d = await start_in_process(s)
    try:
        with pytest.raises(StateDirLocked):
            await start_in_process(s)
    finally:
        await d.stop(timeout=60)
        kill_marked(d.marker, grace_s=0.5)
