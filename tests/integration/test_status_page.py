"""GET /ui through the running daemon (no browser): after a deadlock and the fallback, the page shows
the ladder with the current and last good rung, the incident with its bundle, the server's own log
lines and the start-up timeline recorded from the daemon's snapshots."""

from __future__ import annotations

import re

import httpx
import pytest

pytestmark = pytest.mark.integration
NO_GRAPH = {"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}


async def test_the_page_tells_the_story_of_a_deadlock_and_its_fallback(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("deadlock_after_load", env={"SGLANG_SIM_UNLESS": "disable-cuda-graph"}, fallback=[NO_GRAPH])
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.state == "ready" and x.rung == "no-cuda-graph", 60, "ready on the fallback")
    inc = snap.last_incident
    assert inc is not None and inc.bundle is not None
    async with httpx.AsyncClient(timeout=10) as c:
        resp = await c.get(f"{r.api}/ui")
    assert resp.status_code == 200 and "default-src 'none'" in resp.headers["content-security-policy"]
    text = resp.text
    assert re.search(r"<div id='state' data-state='ready'", text)
    ladder = re.search(r"<table id='ladder'>.*?</table>", text, re.S)
    assert ladder is not None
    row = re.search(r"<tr class='cur'>.*?</tr>", ladder[0], re.S)
    assert row is not None and "no-cuda-graph" in row[0] and "current" in row[0] and "last good" in row[0]
    incidents = re.search(r"<table id='incidents'>.*?</table>", text, re.S)
    assert incidents is not None
    assert inc.bundle in incidents[0] and "startup_stall" in incidents[0] and "idle_deadlock" in incidents[0]
    log = re.search(r"<pre id='log'>(.*?)</pre>", text, re.S)
    assert log is not None and "fired up and ready to roll" in log[1]
    timeline = re.search(r"<svg id='timeline'.*?</svg>", text, re.S)
    assert timeline is not None and "<polyline" in timeline[0] and "<rect x=" in timeline[0]
