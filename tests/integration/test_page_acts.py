"""Issue 53: the status page says what to do and lets a person do it, in a real headless Chromium
against the running daemon and the real simulator, at 1024 px wide: on a fallback rung the banner's
promote button (confirm, then act) says what happens if the preferred rung fails again; FAILED says
the next step and offers start; an incident links its readable summary.txt (served as text) and its
JSON; the badge fits on one line; an incident's reason wraps whole."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fake_supervisor import sample_snapshot
from png import Image, read_png

from api.pagehtml import FALLBACK_COLOUR, STATE_COLOURS, PageData, render

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("chromium") is None, reason="chromium not installed (Debian: apt-get install chromium)"
    ),
]
WIDTH = 1024  # the narrowest width the page is laid out for
LADDER = {
    "env": {"SGLANG_SIM_UNLESS": "disable-cuda-graph"},  # the base rung crashes while loading
    "restart": {"retries_per_rung": 0, "failed_cooldown_s": 0},
    "fallback": [{"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}],
}
FITS = (
    "(() => { const b = document.getElementById('state'); const r = b.getBoundingClientRect();"
    " return {w: b.scrollWidth, cw: b.clientWidth, h: r.height, right: r.right,"
    " page: document.documentElement.scrollWidth, text: b.innerText}; })()"
)


def browser(profile: Path) -> Any:
    from cdp import Chromium

    b = Chromium(profile)
    b.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=900, deviceScaleFactor=1, mobile=False)
    return b


def shot(b: Any, out: Path) -> Image:
    data = base64.b64decode(b.call("Page.captureScreenshot", format="png")["data"])
    out.write_bytes(data)
    return read_png(data)


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


def assert_badge_fits(fit: dict[str, Any], img: Image, colour: str, text: str) -> None:
    assert fit["text"] == text, fit
    assert fit["w"] <= fit["cw"] and fit["h"] == 64, f"the badge wraps or is clipped: {fit}"
    assert fit["right"] <= WIDTH and fit["page"] <= WIDTH, f"the page is wider than {WIDTH} px: {fit}"
    want = rgb(colour)
    right = int(fit["right"])
    for x, y in ((3, 3), (right - 4, 3), (3, 60), (right - 4, 60)):
        got = img.pixel(x, y)
        assert all(abs(a - b) <= 8 for a, b in zip(got, want, strict=True)), f"badge pixel {x},{y} {got} != {want}"


def journal(r: Any) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (r.settings.state_dir / "events.jsonl").read_text().splitlines()]


def launches(r: Any) -> list[str]:
    return [e["rung"] for e in journal(r) if e["event"] == "server_launched"]


async def test_on_a_fallback_the_page_promotes_and_links_the_readable_summary(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # base hangs after loading (a capture, so a bundle); without CUDA graphs it serves
    r = await daemon(sim("deadlock_after_load", tp=1, **LADDER))
    await r.wait_for(lambda x: x.state == "ready" and x.rung == "no-cuda-graph", 60, "ready on the fallback")
    inc = r.snap().last_incident
    assert inc is not None and inc.bundle is not None
    before = r.snap().started_at

    def drive() -> dict[str, Any]:
        b = browser(tmp_path / "profile")
        try:
            b.goto(f"{r.api}/ui")
            seen: dict[str, Any] = {"fit": b.js(FITS), "img": shot(b, tmp_path / "fallback.png")}
            seen["if_fails"] = b.js("document.getElementById('promote-if-fails').innerText")
            seen["button"] = b.js("document.getElementById('banner-promote').innerText")
            seen["txt_href"] = b.js("document.querySelector('#incidents a.summary-txt').getAttribute('href')")
            seen["json_href"] = b.js("document.querySelector('#incidents a.summary-json').getAttribute('href')")
            b.submit("document.querySelector('#incidents a.summary-txt').click()")
            seen["txt_type"] = b.js("document.contentType")
            seen["txt_body"] = b.js("document.body.innerText")
            b.goto(f"{r.api}{seen['json_href']}")
            seen["json_type"] = b.js("document.contentType")
            b.goto(f"{r.api}/ui")
            b.submit("document.getElementById('banner-promote').click()")
            seen["confirm"] = b.js("document.getElementById('consequence').innerText")
            b.submit("document.getElementById('confirm').click()")
            seen["result"] = b.js("document.getElementById('result').innerText")
            return seen
        finally:
            b.close()

    seen = await asyncio.to_thread(drive)
    assert_badge_fits(seen["fit"], seen["img"], FALLBACK_COLOUR, "READY (FALLBACK)")
    assert seen["button"] == "promote to base"
    for words in (seen["if_fails"], seen["confirm"]):
        assert "If base fails" in words and "straight back to no-cuda-graph" in words, words
    assert f"base last failed with {inc.cause}" in seen["confirm"] and inc.bundle in seen["confirm"]
    assert seen["txt_href"] == f"/diagnostics/{inc.bundle}/summary.txt"
    assert seen["json_href"] == f"/diagnostics/{inc.bundle}/summary.json"
    assert seen["txt_type"] == "text/plain"
    summary_txt = (r.settings.state_dir / "diagnostics" / inc.bundle / "summary.txt").read_text()
    assert summary_txt.splitlines()[0].strip() in seen["txt_body"]
    assert seen["json_type"] == "application/json"
    assert seen["result"].startswith("promote: accepted (promoting from no-cuda-graph to base"), seen["result"]

    # base still crashes in this simulator: straight back to no-cuda-graph, as the page said
    def back(x: Any) -> bool:
        return bool(x.state == "ready" and x.rung == "no-cuda-graph" and x.started_at != before)

    await r.wait_for(back, 120, "back on the fallback")
    assert launches(r) == ["base", "no-cuda-graph", "base", "no-cuda-graph"]
    command = next(e for e in journal(r) if e["event"] == "command" and e["kind"] == "restart")
    assert command["rung"] == "base" and "from the status page" in command["reason"]


async def test_failed_says_the_next_step_and_starts_from_the_page(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    both_crash = {**LADDER, "env": {}}  # every rung crashes while loading: the ladder is spent
    r = await daemon(sim("crash_on_load", tp=1, **both_crash))
    await r.wait_for(lambda x: x.state == "failed", 60, "failed")
    assert launches(r) == ["base", "no-cuda-graph"]

    def drive() -> dict[str, Any]:
        b = browser(tmp_path / "profile")
        try:
            b.goto(f"{r.api}/ui")
            seen: dict[str, Any] = {"fit": b.js(FITS), "img": shot(b, tmp_path / "failed.png")}
            seen["next"] = b.js("document.getElementById('failed-next').innerText")
            seen["promote"] = b.js("!!document.getElementById('banner-promote')")
            b.submit("document.getElementById('banner-start').click()")
            seen["confirm"] = b.js("document.getElementById('consequence').innerText")
            b.submit("document.getElementById('confirm').click()")
            seen["result"] = b.js("document.getElementById('result').innerText")
            return seen
        finally:
            b.close()

    seen = await asyncio.to_thread(drive)
    assert_badge_fits(seen["fit"], seen["img"], STATE_COLOURS["failed"], "FAILED")
    words = seen["next"]
    assert "Not serving: every rung failed" in words and "summary.txt" in words and "fix the cause" in words
    assert "preferred rung base" in words and "does not try again by itself" in words
    assert seen["promote"] is False  # no fallback banner while failed
    assert "launches the server" in seen["confirm"]
    assert seen["result"].startswith("start: accepted"), seen["result"]
    await r.wait_for(lambda x: len(launches(r)) >= 3, 60, "a launch after the page's start")
    assert launches(r)[2] == "base"


def test_an_incident_reason_wraps_whole_at_1024_px(tmp_path: Path) -> None:
    # The reason text a capture writes is as long as the hang makes it; the page shows all of it.
    reason = (
        "thread 'TP0 scheduler' waits in ncclAllReduce (nccl/all_reduce.cc:212) while thread 'detokenizer' is "
        "holding the GIL, not releasing it for 183 s; peers on ranks 1-7 wait in the same collective, "
        "see the stacks of every rank in stacks-*.txt: " + "x" * 180 + " END-OF-REASON"
    )
    summary = {"cause": "startup_stall", "hang_class": "idle_deadlock", "reasons": [reason], "frames": ["f" * 300]}
    snap = sample_snapshot(state="hung", reason="no progress on any channel for 180 s")
    page = tmp_path / "incident.html"
    page.write_text(render(PageData(snapshot=snap, bundles=(("b-1", summary),), log_lines=("x",), timeline=())))

    b = browser(tmp_path / "profile")
    try:
        b.goto(page.as_uri())
        text = b.js("document.querySelector('#incidents').innerText")
        overflow = b.js(
            "Array.from(document.querySelectorAll('#incidents td'))"
            ".filter(td => td.scrollWidth > td.clientWidth + 1).length"
        )
        page_w = b.js("document.documentElement.scrollWidth")
        img = shot(b, tmp_path / "incident.png")
    finally:
        b.close()
    assert "holding the GIL, not releasing it for 183 s" in text and "END-OF-REASON" in text
    assert overflow == 0 and page_w <= WIDTH
    assert img.width == WIDTH
