"""The probes and the token through the running daemon: what a kubelet and an operator meet.

`/readyz` follows the server (503 while it starts and after a stop, 200 while it serves), `/livez`
follows the daemon's loop (200 throughout), both open without the token while every other route
is shut without it: the routers, the token dependency and the middleware together, over a real
uvicorn and the simulator.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import pytest

pytestmark = pytest.mark.integration
TOKEN = "probe-test-token-" + "t" * 24


async def _poll_readyz(c: httpx.AsyncClient, until: int, timeout: float) -> list[tuple[int, str]]:
    """Every (status, state) /readyz answered until it answered `until`."""
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = await c.get("/readyz")
        seen.append((r.status_code, r.json()["state"]))
        if r.status_code == until:
            return seen
        await asyncio.sleep(0.1)
    raise AssertionError(f"/readyz never answered {until} in {timeout} s: {seen[-5:]}")


async def test_readyz_follows_the_server_and_livez_the_loop_with_a_token(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    r = await daemon(s, {**os.environ, s.api.token_env: TOKEN})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=r.api, timeout=10) as c:
        # Start-up: not ready, and every answer agrees with the state it names.
        seen = await _poll_readyz(c, 200, 60)
        assert seen[0] == (503, "starting"), seen[:3]
        assert all((code == 200) == (state in ("ready", "degraded")) for code, state in seen), seen
        live = await c.get("/livez")
        assert live.status_code == 200 and live.json()["ok"] is True
        assert 0 <= live.json()["loop_heartbeat_age_s"] < 30

        # The token: probes and metrics open, the rest shut without it.
        for path in ("/status", "/events", "/diagnostics", "/ui", "/logs", "/openapi.json"):
            assert (await c.get(path)).status_code == 401, path
            assert (await c.get(path, headers=auth)).status_code == 200, path
        assert (await c.post("/stop")).status_code == 401
        assert r.snap().state == "ready"  # the refused stop reached nothing
        assert (await c.get("/metrics")).status_code == 200
        logs = await c.get("/logs", params={"lines": 200}, headers=auth)
        assert "fired up and ready to roll" in logs.text

        # Stopped on request: not ready; the daemon itself is alive.
        assert (await c.post("/stop", headers=auth, json={"reason": "probe test"})).status_code == 202
        seen = await _poll_readyz(c, 503, 30)
        await r.wait_for(lambda x: x.state == "stopped", 30, "stopped")
        ready = await c.get("/readyz")
        assert (ready.status_code, ready.json()) == (503, {"ready": False, "state": "stopped"})
        assert (await c.get("/livez")).status_code == 200

        # Started again: ready again.
        assert (await c.post("/start", headers=auth)).status_code == 202
        await _poll_readyz(c, 200, 60)
        assert (await c.get("/livez")).status_code == 200


async def test_a_daemon_with_the_configmaps_api_section_serves_probes_and_the_pods_cli(daemon, sim, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """deploy/kubernetes/configmap.yaml's `[api]`: all interfaces (the kubelet and the other nodes'
    daemons), a token file from the Secret. The probes answer without the token, and
    `sglang-supervisor status` in the pod finds address and token in the mounted config itself."""
    from deploy_files import config_text, config_toml

    api = config_toml()["api"]
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o400)  # as the Secret volume's defaultMode makes it
    s = sim("ok", tp=1, api={"host": api["host"], "token_file": str(token)})
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")
    async with httpx.AsyncClient(base_url=r.api, timeout=10) as c:
        assert (await c.get("/readyz")).status_code == 200
        assert (await c.get("/livez")).status_code == 200
        assert (await c.get("/status")).status_code == 401
    mounted = tmp_path / "config.toml"  # the ConfigMap's text, with this test's port and token path
    mounted.write_text(
        config_text()
        .replace(f"port = {api['port']}", f"port = {s.api.port}")
        .replace(api["token_file"], str(token))
    )
    cmd = [sys.executable, "-m", "supervisor", "status", "--config", str(mounted)]
    done = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ready" in done.stdout
