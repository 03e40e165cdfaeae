"""Issue 53: one format for a moment, ISO 8601 with its offset, in the host's zone on the page and in
the CLI (`--utc` forces UTC), durations as "3 min 10 s", "2 min ago" beside a time on the page.
A real daemon process and real CLI processes under TZ=America/New_York; the page in Chromium."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from daemonproc import cleanup, wait_status

from supervisor.config.render import dump_toml

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path("/usr/share/zoneinfo/America/New_York").exists(), reason="no tzdata"),
]
CLI = [sys.executable, "-m", "supervisor"]
NY = {**os.environ, "TZ": "America/New_York"}
# New York in December is five hours behind UTC; a moment shown in any other form fails these.
LOCAL = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d-05:00\b")
UTC_SHOWN = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00\b")
OTHER = re.compile(r"\d\d:\d\d:\d\d(?:\.\d+)?Z|T\d\d:\d\d:\d\d\+00:00")


def client(*argv: str) -> tuple[int, str, str]:
    done = subprocess.run([*CLI, *argv], env=NY, capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, done.stdout, done.stderr


async def test_times_in_the_hosts_zone_with_offset_and_utc_on_request(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_toml(s))
    proc = subprocess.Popen(
        [*CLI, "run", "--config", str(cfg)], env=NY, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    api = f"http://127.0.0.1:{s.api.port}"
    try:
        await asyncio.to_thread(wait_status, api, lambda x: x["state"] == "ready", 60, proc)

        code, out, err = await asyncio.to_thread(client, "events", "--url", api, "--limit", "5")
        assert code == 0, err
        stamps = [line.split()[0] for line in out.splitlines()]
        assert stamps and all(LOCAL.fullmatch(x) for x in stamps), out
        code, out, err = await asyncio.to_thread(client, "events", "--url", api, "--limit", "5", "--utc")
        assert code == 0 and all(UTC_SHOWN.fullmatch(line.split()[0]) for line in out.splitlines()), out

        code, out, err = await asyncio.to_thread(client, "restart", "--url", api, "--wait")
        assert code == 0, out + err
        code, out, err = await asyncio.to_thread(client, "status", "--url", api)
        assert code == 0, err
        assert LOCAL.search(out) and not OTHER.search(out), out  # the manual incident's time, in New York's

        if shutil.which("chromium") is not None:
            page = await asyncio.to_thread(page_text, api, tmp_path)
            states = page["states"]
            assert LOCAL.search(states) and not OTHER.search(states), states
            assert not re.search(r"(?<![T\d])\d\d:\d\d:\d\d(?![+-]\d)", states), f"a bare clock time: {states}"
            assert LOCAL.search(page["headline"]) and " ago)" in page["headline"], page["headline"]
            assert "this host's zone" in page["footer"]
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 60)
        cleanup(proc, s.paths.state_dir)


def page_text(api: str, tmp_path: Path) -> dict[str, str]:
    from cdp import Chromium

    b = Chromium(tmp_path / "profile")
    try:
        b.goto(f"{api}/ui")
        return {
            "states": str(b.js("document.getElementById('states').innerText")),
            "headline": str(b.js("document.querySelector('header .muted').innerText")),
            "footer": str(b.js("document.querySelector('footer').innerText")),
        }
    finally:
        b.close()


def test_durations_and_moments_read_as_a_person_says_them() -> None:
    from datetime import timezone

    from supervisor.status.timetext import ago, duration, when

    assert [duration(x) for x in (0.85, 12.04, 190, 7500, 2 * 86400 + 4 * 3600)] == [
        "850 ms",
        "12.0 s",
        "3 min 10 s",
        "2 h 5 min",
        "2 d 4 h",
    ]
    assert when("2026-12-07T17:16:51.077Z", utc=True) == "2026-12-07T17:16:51+00:00"
    assert when("2026-12-07T17:16:51+00:00", zone=timezone.utc) == "2026-12-07T17:16:51+00:00"
    assert when("not a time") == "not a time" and when(None) == "-"
    t = "2026-12-07T17:16:51+00:00"
    from datetime import datetime

    now = datetime.fromisoformat(t).timestamp()
    assert ago(t, now + 125) == "2 min 5 s ago" and ago(t, now - 3) == "in 3.0 s"
