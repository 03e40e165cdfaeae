"""The backoff after an incident counts from the verdict: what the evidence and the stop took is not
waited for again (issue 36, the daemon's share of an outage)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.config.settings import settings_from_mapping
from supervisor.daemon.comeback import Comeback


def comeback(tmp_path: Path) -> Comeback:
    s = settings_from_mapping(
        {"server": {"command": ["python3", "-m", "sglang.launch_server"]}, "paths": {"state_dir": str(tmp_path)}}
    )
    events: list[tuple[Any, ...]] = []
    return Comeback(s, lambda *a, **kw: events.append((a, kw)), host="h")


async def test_the_backoff_left_is_what_the_evidence_and_stop_did_not_already_wait(tmp_path: Path) -> None:
    c = comeback(tmp_path)
    assert c.backoff_left(1.0, 100.0) == 1.0  # no verdict yet: the whole backoff
    c.incident("i1", "startup_stall", None, 100.0)
    assert abs(c.backoff_left(1.0, 100.2) - 0.8) < 1e-9
    assert c.backoff_left(1.0, 103.5) == 0.0  # evidence 3 s, stop 0.5 s: the attempts are spaced already
    assert c.backoff_left(8.0, 103.5) == 4.5  # a longer backoff (a crash loop's doubling) still holds
    assert c.backoff_left(1.0, 99.0) == 1.0  # a clock that went back never lengthens it
    c.incident("i2", "exited", None, 200.0)  # the next incident counts from its own verdict
    assert c.backoff_left(2.0, 200.5) == 1.5
