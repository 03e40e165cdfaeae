"""The status page in a real headless Chromium (Debian's `chromium`): screenshots of the running
daemon's page when ready and when failed, and of the page rendered for a hung server, with the
state badge's pixels checked for the state's colour."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
from fake_supervisor import sample_snapshot
from png import Image, read_png

from api.pagehtml import STATE_COLOURS, PageData, render

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("chromium") is None, reason="chromium not installed (Debian: apt-get install chromium)"
    ),
]
BADGE_W, BADGE_H = 220, 64  # the badge's size in pagehtml's CSS, at the top left of the page


def screenshot(url: str, out: Path) -> Image:
    cmd = [
        "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
        "--force-device-scale-factor=1", "--window-size=1000,900", f"--user-data-dir={out.parent / 'profile'}",
        f"--screenshot={out}", url,
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)
    assert out.exists(), result.stdout + result.stderr
    return read_png(out.read_bytes())


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


def assert_badge(img: Image, state: str) -> None:
    want = rgb(STATE_COLOURS[state])
    for x, y in ((3, 3), (BADGE_W - 4, 3), (3, BADGE_H - 4), (BADGE_W - 4, BADGE_H - 4)):
        got = img.pixel(x, y)
        assert all(abs(a - b) <= 8 for a, b in zip(got, want, strict=True)), f"{state}: badge pixel {got} != {want}"
    # most of the badge is its colour (the rest is the state's name, in white)
    assert img.count(want) >= BADGE_W * BADGE_H * 0.6
    assert img.pixel(BADGE_W + 300, 4) == (255, 255, 255), "the badge is a badge, not the page's background"


async def test_ready_then_failed_in_a_real_browser(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "ready", 40, "ready")
    # in a thread: the daemon under test serves the page from this test's event loop
    img = await asyncio.to_thread(screenshot, f"{r.api}/ui", tmp_path / "ready.png")
    assert_badge(img, "ready")
    assert img.height == 900 and img.width == 1000
    await r.stop()

    f = sim("crash_on_load", tp=1, restart={"retries_per_rung": 0, "failed_cooldown_s": 0})
    r2 = await daemon(f)
    await r2.wait_for(lambda x: x.state == "failed", 40, "failed")
    assert_badge(await asyncio.to_thread(screenshot, f"{r2.api}/ui", tmp_path / "failed.png"), "failed")


def test_hung_is_red_in_a_real_browser(tmp_path: Path) -> None:
    # `hung` lasts only until the capture starts (a second on a real daemon), too short to catch
    # reliably; the page rendered for it is the same function the route calls.
    snap = sample_snapshot(state="hung", reason="no progress on any channel for 180 s")
    page = tmp_path / "hung.html"
    page.write_text(render(PageData(snapshot=snap, bundles=(), log_lines=("x",), timeline=())))
    assert_badge(screenshot(page.as_uri(), tmp_path / "hung.png"), "hung")
