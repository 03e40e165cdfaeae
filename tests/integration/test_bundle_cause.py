"""Only hangs get hang classes, through the running daemon (issue 32): a bundle captured for a
speculative regression says what it was captured for and names no hang shape; a hang's bundle still does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_serving_watchdog import SPEC, traffic

from supervisor.status.snapshot import StatusSnapshot

pytestmark = pytest.mark.integration


def ready(s: StatusSnapshot) -> bool:
    return s.state == "ready"


def summary(state_dir: str, bundle: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(state_dir) / "diagnostics" / bundle / "summary.json").read_text())
    return data


async def test_a_spec_regression_bundle_carries_no_hang_class(daemon, sim) -> None:  # type: ignore[no-untyped-def]
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
    assert inc.hang_class is None
    got = summary(s.paths.state_dir, inc.bundle)
    assert got["hang_class"] is None and got["candidates"] == []
    assert got["captured_for"].startswith("captured for spec_regression: speculative acceptance length")
    assert isinstance(got["wait_kinds"], dict) and got["wait_kinds"]  # the threads are still evidence
    text = (Path(s.paths.state_dir) / "diagnostics" / inc.bundle / "summary.txt").read_text()
    assert "Hang class: none (not a hang: captured for spec_regression" in text


async def test_a_hang_bundle_still_has_its_class(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("deadlock_after_load", tp=1)
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.last_incident is not None and x.last_incident.bundle is not None, 40, "stall")
    inc = snap.last_incident
    assert inc is not None and inc.cause == "startup_stall" and inc.bundle is not None
    got = summary(s.paths.state_dir, inc.bundle)
    assert got["hang_class"] == "idle_deadlock" == inc.hang_class
    assert got["captured_for"].startswith("judged hung (startup_stall)")
