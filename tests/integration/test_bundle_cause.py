"""Only hangs get hang classes, through the running daemon (issue 32): a hang's bundle still names
its class and what it was captured for. (A speculative regression's bundle, which names none, is
checked where that regression is driven: test_serving_watchdog's fallback test.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def summary(state_dir: str, bundle: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(state_dir) / "diagnostics" / bundle / "summary.json").read_text())
    return data


async def test_a_hang_bundle_still_has_its_class(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("deadlock_after_load", tp=1)
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.last_incident is not None and x.last_incident.bundle is not None, 40, "stall")
    inc = snap.last_incident
    assert inc is not None and inc.cause == "startup_stall" and inc.bundle is not None
    got = summary(s.paths.state_dir, inc.bundle)
    assert got["hang_class"] == "idle_deadlock" == inc.hang_class
    assert got["captured_for"].startswith("judged hung (startup_stall)")
