"""`status` shows the why, through the running daemon and the real CLI: a stalled server's frozen
gauges are marked with their age (no tok/s), a missing evidence tool and failed writes are named."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from serving import traffic

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "supervisor"]


async def status_rows(api: str) -> tuple[int, dict[str, str], str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "status",
        "--url",
        api,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "SGLANG_SUPERVISOR_CONFIG"},
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    text = out.decode()
    rows: dict[str, str] = {}
    for line in text.splitlines():
        rows.setdefault(line[:15].strip(), line[15:])
    assert proc.returncode is not None
    return proc.returncode, rows, text


async def test_a_serving_stall_shows_frozen_figures_with_their_age_not_a_token_rate(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("serving_stall", watchdog={"serving_stall_s": 12.0})  # stale after 3 s, the verdict at 12 s
    r = await daemon(s)
    ready = await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    assert ready.last_progress_s is None  # no "time since progress" climbing on a serving server
    async with traffic(s.server.port, concurrency=3):
        snap = await r.wait_for(lambda x: x.serving.stale, 30, "the gauges go stale")
        assert snap.state == "ready" and snap.serving.token_rate is None
        assert snap.serving.tokens_moved_s is not None and snap.serving.tokens_moved_s > 3.0
        code, rows, text = await status_rows(r.api)
        assert code in (0, 7), text  # still ready, or the verdict came meanwhile
        if code == 0:
            assert "STALLED: no token for" in rows["serving"] and "tok/s" not in rows["serving"], text
            assert "frozen figures" in rows["serving"]
        done = await r.wait_for(lambda x: x.last_incident is not None, 30, "serving stall")
    assert done.last_incident is not None and done.last_incident.cause == "serving_stall"
    code, rows, text = await status_rows(r.api)
    assert rows["last incident"].startswith("serving_stall") and "why:" in text and "no decode tokens" in text


async def test_a_missing_tool_and_failed_writes_are_named(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok", diagnostics={"py_spy_path": "/nonexistent/py-spy"}))
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    journal = Path(r.settings.paths.state_dir) / "events.jsonl"
    journal.unlink()
    journal.mkdir()  # every journal write now fails (EISDIR), as on a broken state_dir
    async with __import__("httpx").AsyncClient(timeout=30) as c:
        assert (await c.post(f"{r.api}/restart", json={})).status_code == 202
    await r.wait_for(lambda x: x.write_errors.journal > 0 and x.state == "ready", 60, "write errors, ready")
    code, rows, text = await status_rows(r.api)
    assert code == 0, text
    assert rows["self-check"].startswith("FAILED py-spy:") and "/nonexistent/py-spy" in rows["self-check"], text
    assert rows["write errors"].startswith("journal ") and "state_dir" in rows["write errors"], text
