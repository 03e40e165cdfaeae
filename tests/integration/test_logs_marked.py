"""Issue 53: `logs`, `logs -f` and the page's log panel without the daemon's own polls of the server
(its `GET /health` and `GET /metrics` access lines; `--all` shows them), and with a separator line
where each launch began, naming the rung and the pid; through the running daemon, real CLI
processes, the real simulator and the page in a real headless Chromium."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cliproc import Follower, cli
from waiting import until

pytestmark = pytest.mark.integration
LADDER = {
    "env": {"SGLANG_SIM_UNLESS": "disable-cuda-graph"},  # the base rung crashes while loading
    "restart": {"retries_per_rung": 0},
    "fallback": [{"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}],
}
PROBES = ('"GET /health ', '"GET /metrics ')


def launched(r: Any) -> list[dict[str, Any]]:
    lines = (r.settings.state_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "server_launched"]


def separator(e: dict[str, Any]) -> str:
    return f"=== sglang-supervisor: launch of rung {e['rung']}, pid {e['pid']}, at {e['ts']} ==="


def server_log(r: Any) -> str:
    return (r.settings.state_dir / "logs" / "server.log").read_text()


async def test_logs_hide_the_daemons_polls_and_mark_each_launch(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("crash_on_load", tp=1, **LADDER))
    await r.wait_for(lambda x: x.state == "ready" and x.rung == "no-cuda-graph", 60, "ready on the fallback")
    await until(lambda: sum(server_log(r).count(p) for p in PROBES) >= 4, 30, "the daemon's polls in the log")
    base, fallback = launched(r)

    code, out, err = await cli("logs", "--url", r.api, "-n", "400")
    assert code == 0, err
    lines = out.splitlines()
    assert not [x for x in lines if any(p in x for p in PROBES)], "a poll of the daemon's was shown"
    crash = next(i for i, x in enumerate(lines) if "torch.OutOfMemoryError" in x)
    ready = next(i for i, x in enumerate(lines) if "fired up and ready to roll" in x)
    assert lines.index(separator(base)) < crash < lines.index(separator(fallback)) < ready, lines

    code, out, err = await cli("logs", "--url", r.api, "-n", "400", "--all")
    assert code == 0 and any(p in out for p in PROBES) and separator(fallback) in out.splitlines()

    # -f: the polls stay hidden as they come, and a new launch is marked as it happens
    follower = await Follower.start("logs", "-f", "--url", r.api, "-n", "5")
    await follower.until(lambda x: x.strip() != "", 30)
    code, out, err = await cli("restart", "--url", r.api)
    assert code == 0, out + err
    await until(lambda: len(launched(r)) == 3, 60, "the relaunch")
    third = launched(r)[2]
    await follower.until(lambda x: x == separator(third), 60)
    await follower.until(lambda x: "fired up and ready to roll" in x, 60)
    await until(lambda: sum(server_log(r).count(p) for p in PROBES) >= 12, 30, "more polls")
    await asyncio.sleep(1.0)  # the follow's poll is 0.25 s
    assert await follower.interrupt() == 0
    assert not [x for x in follower.lines if any(p in x for p in PROBES)], follower.lines

    if shutil.which("chromium") is not None:
        await page_log_in_a_real_browser(r, base, fallback, tmp_path)


async def page_log_in_a_real_browser(r: Any, base: dict[str, Any], fallback: dict[str, Any], tmp_path: Path) -> None:
    from cdp import Chromium

    def drive() -> tuple[str, str, str]:
        b = Chromium(tmp_path / "profile")
        try:
            b.goto(f"{r.api}/ui")
            shown = str(b.js("document.getElementById('log').innerText"))
            note = str(b.js("document.getElementById('log-note').innerText"))
            b.goto(f"{r.api}/ui?logs=all")
            return shown, note, str(b.js("document.getElementById('log').innerText"))
        finally:
            b.close()

    shown, note, everything = await asyncio.to_thread(drive)
    assert not any(p in shown for p in PROBES), shown
    assert "polls are hidden" in note
    assert separator(launched(r)[-1]) in shown.splitlines(), shown  # the panel's 60 lines hold the last launch
    assert any(p in everything for p in PROBES)
