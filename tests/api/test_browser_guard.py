"""Issue 33: no web page can change anything, and no DNS-rebound name reaches the API.

Through the assembled app, with the Host policy the daemon builds for a loopback bind; the same
requests through a running daemon: tests/integration/test_browser_safety.py."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from fake_supervisor import FakeSupervisor
from fastapi import FastAPI

from api.browser import host_policy

LOOPBACK = host_policy("127.0.0.1", ())
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def bare(app: FastAPI, host: str = "127.0.0.1:8900") -> httpx.AsyncClient:
    """A client that sends only what a browser's form or a no-cors fetch would: no extra header."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{host}")


async def test_a_cross_site_form_post_cannot_stop_the_server(
    make_app: Callable[..., FastAPI], handle: FakeSupervisor
) -> None:
    app = make_app(hosts=LOOPBACK)
    async with bare(app) as c:
        r = await c.post("/stop", content=b"reason=x", headers={**FORM, "Origin": "http://evil.example"})
        assert (r.status_code, r.json()["error"]) == (403, "cross_origin")
        assert "evil.example" in r.json()["detail"]
        # no Origin (an old browser, a privacy extension): the form body itself is refused
        r = await c.post("/stop", content=b"reason=x", headers=FORM)
        assert (r.status_code, r.json()["error"]) == (415, "unsupported_media_type")
        assert "X-Requested-By" in r.json()["detail"] and "Content-Type: application/json" in r.json()["detail"]
        r = await c.post("/restart", content=b'{"reason": "x"}', headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        assert (await c.post("/stop")).status_code == 415  # an empty no-cors POST
        r = await c.post("/stop", json={}, headers={"Sec-Fetch-Site": "cross-site"})
        assert (r.status_code, r.json()["error"]) == (403, "cross_origin")
        assert handle.submitted == []
        # what a script or the CLI sends
        assert (await c.post("/stop", json={"reason": "maintenance"})).status_code == 202
        assert (await c.post("/start", headers={"X-Requested-By": "me"})).status_code == 202
        same = await c.post("/diagnose", json={}, headers={"Origin": "http://127.0.0.1:8900"})
        assert same.status_code == 200
    assert [cmd.kind for cmd in handle.submitted] == ["stop", "start", "diagnose"]
    assert all(cmd.requested_by.startswith("anonymous from") for cmd in handle.submitted)


async def test_a_rebound_host_name_is_refused_on_a_loopback_bind(make_app: Callable[..., FastAPI]) -> None:
    app = make_app(hosts=host_policy("127.0.0.1", ("gpu-host-1.example",)))
    for host in ("attacker.example", "attacker.example:8900", "10.1.2.3:8900"):
        async with bare(app, host) as c:
            for path in ("/status", "/ui", "/metrics", "/events"):
                r = await c.get(path)
                assert (r.status_code, r.json()["error"]) == (421, "unknown_host"), (host, path)
                assert "allowed_hosts" in r.json()["detail"]
            assert (await c.get("/livez")).status_code == 200  # the probes answer whatever the name
    for host in ("127.0.0.1:8900", "localhost:8900", "[::1]:8900", "LOCALHOST", "gpu-host-1.example:8900"):
        async with bare(app, host) as c:
            assert (await c.get("/status")).status_code == 200, host


async def test_an_origin_that_is_not_the_daemon_is_refused_even_for_reads(make_app: Callable[..., FastAPI]) -> None:
    app = make_app(hosts=LOOPBACK)
    async with bare(app) as c:
        for origin in ("http://evil.example", "null", "file://", "http://127.0.0.1.evil.example"):
            r = await c.get("/status", headers={"Origin": origin})
            assert r.status_code == 403, origin
        assert (await c.get("/status", headers={"Origin": "http://localhost:8900"})).status_code == 200


def test_the_host_policy_of_a_wider_bind() -> None:
    wide = host_policy("0.0.0.0", ("sglang.example.com",), machine_names=("gpu-host-1",))
    assert wide.allows("10.0.0.5:8900") and wide.allows("[fd00::5]:8900")  # probes and scrapes by IP
    assert wide.allows("gpu-host-1:8900") and wide.allows("SGLANG.example.com")
    assert not wide.allows("localhost:8900")  # loopback names only on a loopback bind
    assert not wide.allows("attacker.example")
    assert host_policy("0.0.0.0", ("*",)).allows("anything.example")
    loop = host_policy("127.0.0.1", (), machine_names=("gpu-host-1",))
    assert not loop.allows("gpu-host-1") and not loop.allows("10.0.0.5") and loop.allows("127.0.0.2")


async def test_with_a_token_a_request_without_it_learns_only_401(make_app: Callable[..., FastAPI], token: str) -> None:
    async with bare(make_app(token=token, hosts=LOOPBACK), "attacker.example") as c:
        r = await c.post("/stop", content=b"x=1", headers=FORM)
        assert r.status_code == 401


def test_allowed_hosts_refuses_a_url_with_the_key_named() -> None:
    import pytest

    from supervisor.common.configerror import ConfigError
    from supervisor.config.settings import settings_from_mapping

    base = {"server": {"command": ["python3", "-m", "sglang.launch_server"]}}
    ok = settings_from_mapping({**base, "api": {"allowed_hosts": ["gpu-host-1.example", "*"]}})
    assert ok.api.allowed_hosts == ("gpu-host-1.example", "*")
    with pytest.raises(ConfigError, match=r"api.allowed_hosts.*'http://x' is not a host name"):
        settings_from_mapping({**base, "api": {"allowed_hosts": ["http://x"]}})


async def test_a_page_on_another_port_of_the_same_host_is_another_origin(make_app: Callable[..., FastAPI]) -> None:
    """Issue 50: the origin check compared names only, so a page served on 127.0.0.1:3000 passed
    for the API on 127.0.0.1:8900."""
    app = make_app(hosts=LOOPBACK)
    async with bare(app) as c:
        for origin in ("http://127.0.0.1:3000", "http://localhost:8901", "http://127.0.0.1", "https://localhost"):
            r = await c.get("/status", headers={"Origin": origin})
            assert (r.status_code, r.json()["error"]) == (403, "cross_origin"), origin
        for origin in ("http://127.0.0.1:8900", "http://localhost:8900", "http://[::1]:8900"):
            assert (await c.get("/status", headers={"Origin": origin})).status_code == 200, origin
    async with bare(app, "localhost") as c:  # no port in Host: the scheme's default
        assert (await c.get("/status", headers={"Origin": "http://127.0.0.1"})).status_code == 200
        assert (await c.get("/status", headers={"Origin": "http://127.0.0.1:8900"})).status_code == 403
