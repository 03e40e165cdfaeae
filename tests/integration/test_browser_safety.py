"""Issue 33's cross-site attacks through the running daemon (no token, loopback: the default): a
browser-style form POST to `/stop` from `Origin: evil.example`, the same without an Origin, and a
DNS-rebound `Host: attacker.example`. Each is refused and the server keeps serving; what a script
sends still works and is journalled with who asked."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.integration
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


async def test_cross_site_requests_and_rebound_names_cannot_reach_the_default_daemon(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok", tp=1))
    await r.wait_for(lambda x: x.state == "ready", 40, "ready")
    async with httpx.AsyncClient(base_url=r.api, timeout=10) as c:
        forged = await c.post("/stop", content=b"reason=pwned", headers={**FORM, "Origin": "http://evil.example"})
        assert (forged.status_code, forged.json()["error"]) == (403, "cross_origin")
        plain = await c.post("/stop", content=b"reason=pwned", headers=FORM)
        assert plain.status_code == 415 and "X-Requested-By" in plain.json()["detail"]
        empty = await c.post("/restart")
        assert empty.status_code == 415
        rebound = await c.get("/status", headers={"Host": "attacker.example"})
        assert (rebound.status_code, rebound.json()["error"]) == (421, "unknown_host")
        assert (await c.get("/ui", headers={"Host": "attacker.example:8900"})).status_code == 421
        assert (await c.get("/livez", headers={"Host": "attacker.example"})).status_code == 200
        assert r.snap().state == "ready"  # nothing reached the server

        ok = await c.post("/stop", json={"reason": "maintenance"})
        assert ok.status_code == 202
    await r.wait_for(lambda x: x.state == "stopped", 40, "stopped")
    lines = [json.loads(x) for x in (r.settings.state_dir / "events.jsonl").read_text().splitlines()]
    commands = [e for e in lines if e["event"] == "command"]
    assert [e["kind"] for e in commands] == ["stop"]  # the refused ones never became commands
    assert commands[0]["requested_by"] == "anonymous from 127.0.0.1"
