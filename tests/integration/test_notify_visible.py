"""Issue 38: a notification target that fails is visible in `status` and on the page, not only in
the journal; a daemon's `status` and page give the same restarts/incidents figures, said as
counted since the daemon started."""

from __future__ import annotations

import argparse
import asyncio
import sys

import httpx
import pytest
from notifyhook import with_notify

from supervisor.cli import build_parser
from supervisor.client.verbs import run_client
from supervisor.config.alerting import NotifyTarget

pytestmark = pytest.mark.integration


async def test_a_failing_target_shows_in_status_and_on_the_page(daemon, sim, capsys) -> None:  # type: ignore[no-untyped-def]
    broken = NotifyTarget(
        name="pager-hook",
        kind="exec",
        argv=(sys.executable, "-c", "import sys; sys.stderr.write('no route to pager'); sys.exit(3)"),
        events=("failed",),
        retries=0,
    )
    s = with_notify(sim("crash_on_load", tp=1, restart={"retries_per_rung": 0, "failed_cooldown_s": 0}), broken)
    r = await daemon(s)
    snap = await r.wait_for(lambda x: any(n.failed for n in x.notifications), 60, "the failed delivery")
    (view,) = snap.notifications
    assert view.target == "pager-hook" and view.failed == 1 and view.ok == 0 and view.last_failed_at
    capsys.readouterr()
    args: argparse.Namespace = build_parser().parse_args(["status", "--url", r.api])
    await asyncio.to_thread(run_client, args, {})
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("notify FAILING"))
    assert "pager-hook: 1 failed, 0 dropped, 0 ok since the daemon started" in line
    async with httpx.AsyncClient(timeout=10) as c:
        page = (await c.get(f"{r.api}/ui")).text
    assert "notify pager-hook" in page and "1 failed, 0 dropped (0 ok)" in page
