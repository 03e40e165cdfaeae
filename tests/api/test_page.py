"""GET /ui at the HTML level (no browser): what the page shows for each state, escaping, redaction,
auth, the strict content security policy; and the start-up timeline it draws."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from fake_supervisor import FakeSupervisor, sample_snapshot, sample_starting_snapshot
from fastapi import FastAPI

from api.pagehtml import STATE_COLOURS, PageData, render
from supervisor.status.journal import Journal
from supervisor.status.snapshot import GpuView, ProgressView
from supervisor.status.timeline import Timeline

BUNDLE = "20250101T000000Z-startup_stall"


async def page(app: FastAPI, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", headers=headers) as c:
        return await c.get("/ui")


def badge(text: str) -> tuple[str, str]:
    m = re.search(
        r"<div id='state' data-state='([a-z]+)' data-fallback='[a-z]+' style='background:(#[0-9a-f]{6})'", text
    )
    assert m is not None, text[:500]
    return m[1], m[2]


async def test_a_ready_server_shows_green_its_ladder_and_its_evidence(
    make_app: Callable[..., FastAPI], handle: FakeSupervisor, diag_dir: Path
) -> None:
    (diag_dir.parent / "logs").mkdir()
    (diag_dir.parent / "logs" / "server.log").write_text(
        "[2025] Load weight begin.\n<script>alert('x')</script>\nHF_TOKEN=hf_abcdefghijklmnop1234\n"
        "The server is fired up and ready to roll!\n"
    )
    r = await page(make_app())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    text = r.text
    assert badge(text) == ("ready", STATE_COLOURS["ready"])
    ladder = re.search(r"<table id='ladder'>.*?</table>", text, re.S)
    assert ladder is not None
    for rung in handle.snap.ladder:
        assert f"<td>{rung}</td>" in ladder[0]
    assert "current" in ladder[0] and "last good" in ladder[0]
    assert f"<td>{BUNDLE}</td>" in text and "idle_deadlock" in text and f"/diagnostics/{BUNDLE}" in text
    assert "ready to roll" in text
    assert "<script>" not in text and "&lt;script&gt;" in text, "log lines are escaped"
    assert "hf_abcdefghijklmnop1234" not in text, "secrets in the log are redacted"
    assert "tokens/s" in text and "512" in text


async def test_hung_and_failed_are_red_and_say_why(make_app: Callable[..., FastAPI], handle: FakeSupervisor) -> None:
    handle.snap = sample_snapshot(state="hung", reason="no progress on any channel for 180 s")
    state, colour = badge((await page(make_app())).text)
    assert state == "hung" and colour == STATE_COLOURS["hung"]
    handle.snap = sample_snapshot(state="failed", reason="ladder exhausted: last rung no-cuda-graph failed")
    text = (await page(make_app())).text
    assert badge(text) == ("failed", STATE_COLOURS["failed"])
    assert "ladder exhausted" in text
    assert "tokens/s" not in text, "serving figures only while serving"
    for red in (STATE_COLOURS["hung"], STATE_COLOURS["failed"]):
        r, g, b = (int(red[i : i + 2], 16) for i in (1, 3, 5))
        assert r > 2 * g and r > 2 * b, f"{red} is not a red"
    assert len(set(STATE_COLOURS.values())) == len(STATE_COLOURS), "each state its colour"


async def test_the_page_needs_the_token_as_status_does(make_app: Callable[..., FastAPI], token: str) -> None:
    app = make_app(token=token)
    assert (await page(app)).status_code == 401
    assert (await page(app, token)).status_code == 200


async def test_a_starting_server_shows_its_phase_and_progress(
    make_app: Callable[..., FastAPI], handle: FakeSupervisor
) -> None:
    handle.snap = sample_starting_snapshot()
    text = (await page(make_app())).text
    assert badge(text)[0] == "starting"
    assert "loading_weights" in text and "45/61" in text


def test_timeline_records_one_launch_while_starting_and_draws_it() -> None:
    now = [0.0]
    tl = Timeline(lambda: now[0], max_points=8, min_gap_s=0.5)
    base = sample_starting_snapshot().model_copy(update={"started_at": "2025-01-01T00:00:00+00:00"})
    for step in range(20):
        now[0] = step * 1.0
        progress = ProgressView(done=step, total=20, unit="it", label="Loading", fraction=step / 20)
        gpu = GpuView(status="ok", tree_mem_bytes=step * 2**30)
        tl.feed(base.model_copy(update={"progress": progress, "gpu": gpu, "channels_moved": ("log", "gpu_mem")}))
    now[0] = 20.0
    tl.feed(base.model_copy(update={"state": "ready", "progress": None}))
    now[0] = 30.0
    tl.feed(base.model_copy(update={"state": "ready"}))  # after the start-up: not recorded
    pts = tl.points()
    assert len(pts) <= 8 and pts[0].t_s == 0.0 and pts[-1].t_s == 20.0 and pts[-1].state == "ready"
    svg = render(PageData(snapshot=sample_snapshot(), bundles=(), log_lines=(), timeline=pts))
    assert "<svg id='timeline'" in svg and svg.count("<polyline") == 2 and "20 s" in svg
    # a new launch starts a new timeline
    now[0] = 40.0
    tl.feed(base.model_copy(update={"started_at": "2025-01-01T00:01:00+00:00"}))
    assert len(tl.points()) == 1


def test_bundle_summaries_of_any_shape_render(tmp_path: Path) -> None:
    odd: list[tuple[str, dict[str, Any] | None]] = [
        ("a", None),
        ("b", {"reasons": "not a list", "frames": [1, 2]}),
        ("c", {"cause": "<b>x</b>", "reasons": ["r1", "r2", "r3"], "rung": "base", "phase": "capturing_graphs"}),
    ]
    text = render(PageData(snapshot=sample_snapshot(), bundles=odd, log_lines=(), timeline=()))
    assert "&lt;b&gt;x&lt;/b&gt;" in text and "r1; r2" in text and "capturing_graphs" in text


def test_the_log_tail_shows_a_progress_bar_as_a_terminal_does(tmp_path: Path) -> None:
    from api.page import tail_lines

    log = tmp_path / "server.log"
    log.write_bytes(b"first\nbar  0%\rbar 50%\rbar 100%\r\nlast\n")
    assert tail_lines(log, 10) == ["first", "bar 100%", "last"]
    assert tail_lines(log, 1) == ["last"]
    assert tail_lines(tmp_path / "missing.log", 5) == []
    log.write_bytes(b"x" * 100 + b"\n" + b"tail\n")
    assert tail_lines(log, 5, max_bytes=50) == ["tail"], "a line cut by the read window is dropped"


def test_timeline_keeps_its_newest_point_at_any_bound() -> None:
    for bound in (4, 5, 7):
        now = [0.0]
        tl = Timeline(lambda now=now: now[0], max_points=bound, min_gap_s=0.0)  # type: ignore[misc]
        base = sample_starting_snapshot().model_copy(update={"started_at": "t0"})
        for step in range(50):
            now[0] = float(step)
            tl.feed(base)
            assert tl.points()[-1].t_s == float(step) and len(tl.points()) <= bound


async def test_the_page_and_its_login_never_wait_on_the_supervisor_loops_threads(
    make_app: Callable[..., FastAPI], journal: Journal, token: str
) -> None:
    """docs/API.md: API file work runs on the API's own threads (api/pool.py). The loop's default
    executor, which the supervisor loop uses, is held busy here: the page and a login still answer."""
    loop = asyncio.get_running_loop()
    release = threading.Event()
    loop.set_default_executor(ThreadPoolExecutor(1))
    held = loop.run_in_executor(None, release.wait)
    try:
        assert (await asyncio.wait_for(page(make_app()), 10)).status_code == 200
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=make_app(token=token)), base_url="http://t"
        ) as c:
            login = await asyncio.wait_for(c.post("/ui/login", content=f"token={token}".encode(), headers=form), 10)
        assert login.status_code == 303
        assert any('"page_login"' in x for x in Path(journal.path).read_text().splitlines())
    finally:
        release.set()
        await held
