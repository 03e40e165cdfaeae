"""Issue 53's nits, each as an operator meets it, with real `sglang-supervisor` processes against the
running daemon and the real simulator: no error-level line when the daemon stops with `logs -f` and
`events --follow` attached; `restart --wait` without the "pass --wait" hint; `start` idempotent;
a refused token's hint names the file it was read from; `promote` on a stopped server refused."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cliproc import Follower, cli
from daemonproc import cleanup, wait_status

from supervisor.config.render import dump_toml

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "supervisor"]
TOKEN = "oncall-nits-token-" + "q" * 24


async def test_a_stop_with_followers_attached_writes_no_error_line(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_toml(s))
    out = tmp_path / "daemon.jsonl"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [*CLI, "run", "--config", str(cfg), "--log-json"], stdout=sink, stderr=subprocess.STDOUT
        )
    api = f"http://127.0.0.1:{s.api.port}"
    try:
        await asyncio.to_thread(wait_status, api, lambda x: x["state"] == "ready", 60, proc)
        logs = await Follower.start("logs", "-f", "--url", api)
        events = await Follower.start("events", "--follow", "--url", api)
        await logs.until(lambda x: x.strip() != "", 30)
        await events.until(lambda x: " state_changed " in x, 30)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0
        for f in (logs, events):  # each ends, saying why, with "the daemon is not there" (3)
            assert await asyncio.wait_for(f.proc.wait(), 30) == 3
            assert f.proc.stderr is not None
            assert b"the daemon closed the stream" in await f.proc.stderr.read()
    finally:
        cleanup(proc, s.paths.state_dir)
    records = [json.loads(x) for x in out.read_text().splitlines() if x.startswith("{")]
    assert any(r.get("event") == "daemon_exit" for r in records), records[-5:]
    loud = [r for r in records if r.get("level") in ("error", "critical")]
    assert loud == [], loud  # before: "Cancel 2 running task(s)" and two CancelledError tracebacks


async def test_restart_wait_start_twice_and_promote_when_stopped(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok", tp=1))
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")

    code, out, err = await cli("restart", "--url", r.api, "--wait")
    assert code == 0, out + err
    assert "pass --wait" not in out + err and out.splitlines()[0].endswith("; waiting for it"), out

    # start on a running server: done already, with the state, exit 0 (as stop on a stopped one)
    code, out, err = await cli("start", "--url", r.api)
    assert (code, out.strip()) == (0, "start accepted (already running (state ready))"), out + err
    code, out, err = await cli("start", "--url", r.api, "--wait", "--wait-timeout", "60")
    assert code == 0, out + err
    assert out.splitlines()[-1] == f"start: ready on rung base, pid {r.snap().pid}", out
    code, out, err = await cli("start", "--url", r.api, "--rung", "base")
    assert code == 1 and "409" in err and "restart --rung base" in err, out + err

    # promote on a stopped server: refused, and the answer says how to start it on the preferred rung
    code, out, err = await cli("stop", "--url", r.api, "--wait")
    assert code == 0, out + err
    code, out, err = await cli("promote", "--url", r.api)
    assert code == 1 and "409" in err and "promote does not start a stopped server" in err, out + err
    assert "sglang-supervisor start --rung base" in err
    assert r.snap().state == "stopped"


async def test_a_refused_token_names_the_file_it_was_read_from(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    r = await daemon(s, {**os.environ, s.api.token_env: TOKEN})
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")
    wrong = tmp_path / "old-token"
    wrong.write_text("not-the-token-" + "z" * 24 + "\n")
    wrong.chmod(0o600)
    code, out, err = await cli("status", "--url", r.api, "--token-file", str(wrong))
    assert code == 4, out + err
    assert f"the token sent was read from --token-file {wrong}" in err and "refused it" in err, err
    code, out, err = await cli("status", "--url", r.api)
    assert code == 4 and "no token was sent" in err, err


DOCS = Path(__file__).resolve().parents[2] / "docs"
ROOT = DOCS.parent


async def test_metrics_doc_names_every_self_check_tool(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    import re

    import httpx

    r = await daemon(sim("ok", tp=1))
    await r.wait_for(lambda x: bool(x.selfcheck), 60, "the self-check")
    async with httpx.AsyncClient(timeout=30) as c:
        scraped = set(
            re.findall(r'sglang_supervisor_selfcheck_ok\{tool="([^"]+)"\}', (await c.get(f"{r.api}/metrics")).text)
        )
    # and what the sources can report on other hosts (a GPU with GPM, the simulator's GPU)
    reported = set(re.findall(r'ToolCheck\(\s*name="([a-z-]+)"', _sources()))
    assert scraped and scraped <= reported, (scraped, reported)
    row = next(
        x for x in (DOCS / "METRICS.md").read_text().splitlines() if x.startswith("| `sglang_supervisor_selfcheck_ok`")
    )
    missing = sorted(t for t in reported if f"`{t}`" not in row)
    assert missing == [], f"docs/METRICS.md's selfcheck_ok row lacks {missing}"


def _sources() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "supervisor").rglob("*.py"))


def test_the_docs_cite_no_design_doc_that_is_not_shipped() -> None:
    assert not (ROOT / "DESIGN.md").exists() and not (DOCS / "DESIGN.md").exists()
    # docs/DECISIONS.md records history ("DESIGN.md still says ..."); the reference docs point to what ships
    citing = [
        p.name
        for p in (*DOCS.glob("*.md"), ROOT / "README.md")
        if p.name != "DECISIONS.md" and "DESIGN.md" in p.read_text()
    ]
    assert citing == []


async def test_head_of_the_page_answers_200(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    import httpx

    r = await daemon(sim("ok", tp=1))
    async with httpx.AsyncClient(timeout=30) as c:
        head = await c.head(f"{r.api}/ui")  # a load balancer's or `curl -I`'s check: was 405
        assert head.status_code == 200 and head.headers["content-type"].startswith("text/html")
        assert head.content == b""
