"""The CLI client against the running daemon and the real simulator: what an operator sees from
`diagnose`, `diagnose --native`, `events`, `bundles` and `stop` (py-spy runs for real)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import stat
from pathlib import Path

import pytest

from supervisor.cli import build_parser
from supervisor.client.verbs import run_client

pytestmark = pytest.mark.integration
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")  # the in-process daemon's own log on stdout


def printed(capsys: pytest.CaptureFixture[str]) -> str:
    """What the client printed, without the daemon's log lines that share stdout in this test."""
    return "\n".join(x for x in capsys.readouterr().out.splitlines() if not LOG_LINE.match(x))


async def cli(api: str, *argv: str) -> int:
    args: argparse.Namespace = build_parser().parse_args([argv[0], "--url", api, *argv[1:]])
    return await asyncio.to_thread(run_client, args, {})  # the client blocks; the daemon runs on this loop


async def test_diagnose_of_a_healthy_server(daemon, sim, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok", diagnostics={"native": True}))  # the shipped default
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")

    assert await cli(r.api, "diagnose") == 0
    out = printed(capsys)
    assert "not hung (state ready): no hang class" in out and "hang_class:" not in out
    # Without --native a healthy server is not paused, and the answer says why native frames are missing.
    assert "py-spy-native: skipped for" in out and "without pausing" in out
    assert "--nonblocking" not in out  # the operator asked for nothing of the kind

    assert await cli(r.api, "diagnose", "--native", "--json") == 0
    body = json.JSONDecoder().raw_decode(printed(capsys).strip())[0]
    assert body["hung"] is False and body["state"] == "ready" and "not hung" in body["message"]
    native = [t for t in body["summary"]["tools"] if t["tool"] == "py-spy-native"]
    assert native and all(t["outcome"] == "ok" for t in native), native
    files = body["summary"]["files"]
    assert any(f.startswith("pyspy-native-") for f in files), files
    assert r.snap().state == "ready"  # a person's capture never restarts anything

    assert await cli(r.api, "bundles") == 0
    listed = printed(capsys).splitlines()
    assert len(listed) == 2 and body["bundle_id"] in listed[0]
    assert await cli(r.api, "bundles", body["bundle_id"]) == 0
    shown = printed(capsys)
    assert "trigger: manual" in shown and "not judged hung" in shown


async def test_stop_twice_and_the_events_it_leaves(daemon, sim, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok"))
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    assert await cli(r.api, "stop", "--reason", "maintenance") == 0
    assert "stop accepted" in printed(capsys)
    await r.wait_for(lambda x: x.state == "stopped", 30, "stopped")
    assert await cli(r.api, "stop") == 0
    assert "(already stopped)" in printed(capsys)
    assert await cli(r.api, "events", "--event", "state_changed") == 0
    lines = printed(capsys).splitlines()
    assert lines and all(" state_changed " in x for x in lines)
    assert "new=stopped" in lines[-1] and "maintenance" in lines[-1]


async def test_bundles_logs_and_journal_keep_the_units_modes(daemon, sim, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """systemd/README.md: under the unit's UMask=0027 what the daemon writes is 0750 / 0640."""
    old = os.umask(0o027)
    try:
        r = await daemon(sim("ok"))
        await r.wait_for(lambda x: x.state == "ready", 30, "ready")
        assert await cli(r.api, "diagnose") == 0
    finally:
        os.umask(old)
    printed(capsys)
    state = Path(r.settings.paths.state_dir)

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    bundles = [p for p in (state / "diagnostics").iterdir() if not p.name.startswith(".")]
    assert bundles and mode(state / "diagnostics") == 0o750
    for b in bundles:
        assert mode(b) == 0o750, b
        assert {f.name: mode(f) for f in b.iterdir()} == {f.name: 0o640 for f in b.iterdir()}
    logs = list((state / "logs").iterdir())
    assert logs and all(mode(f) == 0o640 for f in logs if f.is_file())
    assert mode(state / "events.jsonl") == 0o640


async def test_the_client_pointed_at_sglangs_port_says_so(daemon, sim, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok", tp=1))
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    sglang = f"http://127.0.0.1:{r.settings.server.port}"
    capsys.readouterr()
    assert await cli(sglang, "status") == 1
    err = capsys.readouterr().err
    assert "HTTP 404" in err and "is SGLang's own server (model" in err and "[api] port (default 8900)" in err
    assert "Traceback" not in err


def test_the_default_address_is_said_to_be_the_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from freeport import free_port

    from supervisor.client import locate, verbs

    monkeypatch.setattr(verbs, "DEFAULT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setattr(locate, "DEFAULT_CONFIG", tmp_path / "absent.toml")
    args = build_parser().parse_args(["status"])
    assert run_client(args, {}) == 3
    err = capsys.readouterr().err
    assert "(the default: no --url, no --config" in err and "next: is the daemon running" in err
