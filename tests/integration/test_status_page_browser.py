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


FALLBACK_LADDER = {
    "env": {"SGLANG_SIM_UNLESS": "disable-cuda-graph"},  # the base rung crashes while loading
    "restart": {"retries_per_rung": 0},
    "fallback": [{"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}],
}
LOGIN_TOKEN = "page-login-token-" + "k" * 24


async def test_log_in_see_the_newest_log_line_and_the_fallback_then_log_out(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import os

    from cdp import Chromium

    s = sim("crash_on_load", tp=1, **FALLBACK_LADDER)
    r = await daemon(s, {**os.environ, s.api.token_env: LOGIN_TOKEN})
    await r.wait_for(lambda x: x.state == "ready" and x.rung == "no-cuda-graph", 60, "ready on the fallback")

    def drive() -> dict[str, object]:
        b = Chromium(tmp_path / "profile")
        try:
            b.goto(f"{r.api}/ui")
            seen: dict[str, object] = {"login_form": b.js("!!document.getElementById('token')")}
            b.js(f"document.getElementById('token').value = {LOGIN_TOKEN!r}")
            b.submit("document.getElementById('login').click()")
            seen["state"] = b.js("document.getElementById('state')?.dataset.state")
            seen["fallback"] = b.js("document.getElementById('state').dataset.fallback")
            seen["badge"] = b.js("getComputedStyle(document.getElementById('state')).backgroundColor")
            seen["banner"] = b.js("document.getElementById('fallback').innerText")
            seen["cookie_to_js"] = b.js("document.cookie")
            seen["newest"] = b.js("document.getElementById('log-newest').innerText")
            # the log box overflows and is scrolled to its end: the newest line lies inside the box
            seen["overflows"] = b.js("(e => e.scrollHeight > e.clientHeight)(document.getElementById('logbox'))")
            seen["newest_in_view"] = b.js(
                "(() => { const box = document.getElementById('logbox').getBoundingClientRect();"
                " const line = document.getElementById('log-newest').getBoundingClientRect();"
                " return line.top >= box.top - 1 && line.bottom <= box.bottom + 1; })()"
            )
            b.submit("document.getElementById('logout').click()")
            seen["after_logout"] = b.js("!!document.getElementById('token') && !document.getElementById('state')")
            b.goto(f"{r.api}/status")
            seen["status_after_logout"] = b.js("document.body.innerText")
            return seen
        finally:
            b.close()

    seen = await asyncio.to_thread(drive)
    assert seen["login_form"] is True
    assert (seen["state"], seen["fallback"]) == ("ready", "true")
    assert seen["badge"] == "rgb(212, 167, 44)"  # amber, not ready's green
    assert "no-cuda-graph" in str(seen["banner"]) and "base" in str(seen["banner"]) and "exited" in str(seen["banner"])
    assert seen["cookie_to_js"] == ""  # HttpOnly: no script on the page could read the session
    log = (r.settings.state_dir / "logs" / "server.log").read_text().splitlines()
    shown = [ln.rsplit("\r", 1)[-1][:500].strip() for ln in log if ln.strip()]
    # the server keeps logging its probes: the line shown is among the very last ones written
    assert str(seen["newest"]).strip() in shown[-8:], (seen["newest"], shown[-8:])
    assert seen["overflows"] is True and seen["newest_in_view"] is True
    assert seen["after_logout"] is True
    assert "unauthorized" in str(seen["status_after_logout"])
