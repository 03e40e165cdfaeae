"""Issue 38: a person logs in to the page with the token; the cookie session, its CSRF-protected
forms, confirmed actions journalled with who asked, logout, expiry. A browser drives the same
through a running daemon in tests/integration/test_status_page_browser.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import httpx
from fake_supervisor import FakeSupervisor
from fastapi import FastAPI

from api.session import SessionStore
from supervisor.status.journal import Journal

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def browser(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8900")


def csrf_of(html: str) -> str:
    m = re.search(r"name='csrf' value='([^']+)'", html)
    assert m is not None, html[:400]
    return m[1]


def events(journal: Journal) -> list[dict[str, object]]:
    return [json.loads(line) for line in Path(journal.path).read_text().splitlines()]


async def test_log_in_act_with_confirmation_and_log_out(
    make_app: Callable[..., FastAPI], handle: FakeSupervisor, journal: Journal, token: str
) -> None:
    app = make_app(token=token)
    async with browser(app) as c:
        r = await c.get("/ui")
        assert r.status_code == 401 and "name='token'" in r.text and "action='/ui/login'" in r.text
        assert "content-security-policy" in r.headers

        r = await c.post("/ui/login", content=b"token=wrong", headers=FORM)
        assert r.status_code == 401 and "not the token of this daemon" in r.text
        assert "sgs_session" not in r.headers.get("set-cookie", "")

        r = await c.post("/ui/login", content=f"token={token}".encode(), headers=FORM)
        assert r.status_code == 303 and r.headers["location"] == "/ui"
        cookie = r.headers["set-cookie"]
        for flag in ("HttpOnly", "SameSite=Strict", "Max-Age=43200", "Path=/"):
            assert flag in cookie, cookie
        assert token not in cookie

        page = await c.get("/ui")
        assert page.status_code == 200 and "id='logout'" in page.text and "id='act-restart'" in page.text
        csrf = csrf_of(page.text)
        assert (await c.get("/status")).status_code == 200  # the page's links: reads only
        assert (await c.get("/diagnostics")).status_code == 200
        r = await c.post("/stop", json={})  # a change through REST needs the bearer token
        assert r.status_code == 401

        r = await c.post("/ui/action", content=b"action=restart", headers=FORM)
        assert r.status_code == 403 and "CSRF" in r.text
        r = await c.post("/ui/action", content=f"action=restart&csrf={csrf}".encode(), headers=FORM)
        assert r.status_code == 200 and "id='confirm'" in r.text and "stops the server" in r.text
        assert handle.submitted == []  # asked, not done
        r = await c.post("/ui/action", content=f"action=reboot&csrf={csrf}&confirm=yes".encode(), headers=FORM)
        assert r.status_code == 400 and handle.submitted == []
        r = await c.post("/ui/action", content=f"action=restart&csrf={csrf}&confirm=yes".encode(), headers=FORM)
        assert r.status_code == 200 and "restart: accepted" in r.text
        (cmd,) = handle.submitted
        assert cmd.kind == "restart" and cmd.requested_by.startswith("page session ")
        assert cmd.requested_by in cmd.reason

        assert (await c.post("/ui/logout", content=b"csrf=stale", headers=FORM)).status_code == 403
        r = await c.post("/ui/logout", content=f"csrf={csrf}".encode(), headers=FORM)
        assert r.status_code == 303 and "Max-Age=0" in r.headers["set-cookie"]
        assert (await c.get("/ui")).status_code == 401
        assert (await c.get("/status")).status_code == 401
    names = [e["event"] for e in journal.read(100)]  # refused logins are kept apart (issue 50)
    assert names[-3:] == ["page_login_refused", "page_login", "page_logout"]
    assert token not in Path(journal.path).read_text()


async def test_a_stolen_cookie_dies_with_logout_and_a_cross_site_login_is_refused(
    make_app: Callable[..., FastAPI], token: str
) -> None:
    app = make_app(token=token)
    async with browser(app) as c:
        r = await c.post("/ui/login", content=f"token={token}".encode(), headers=FORM)
        value = r.headers["set-cookie"].split(";", 1)[0]
        csrf = csrf_of((await c.get("/ui")).text)
        await c.post("/ui/logout", content=f"csrf={csrf}".encode(), headers=FORM)
    async with browser(app) as thief:
        assert (await thief.get("/ui", headers={"Cookie": value})).status_code == 401
        r = await thief.post(
            "/ui/login", content=f"token={token}".encode(), headers={**FORM, "Origin": "http://evil.example"}
        )
        assert r.status_code == 403


async def test_scripts_keep_the_bearer_and_no_token_means_no_login(
    make_app: Callable[..., FastAPI], handle: FakeSupervisor, token: str
) -> None:
    async with browser(make_app(token=token)) as c:
        r = await c.get("/ui", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and "id='logout'" not in r.text
    async with browser(make_app(token=None)) as c:
        page = await c.get("/ui")
        assert page.status_code == 200 and "id='act-stop'" in page.text
        r = await c.post("/ui/action", content=b"action=stop&confirm=yes&csrf=guess", headers=FORM)
        assert r.status_code == 403 and handle.submitted == []
        csrf = csrf_of(page.text)
        r = await c.post("/ui/action", content=f"action=stop&confirm=yes&csrf={csrf}".encode(), headers=FORM)
        assert r.status_code == 200 and [c.kind for c in handle.submitted] == ["stop"]


def test_a_session_expires_and_the_store_stays_bounded() -> None:
    now = [1000.0]
    store = SessionStore("s3cret-token", ttl_s=60, clock=lambda: now[0])
    assert store.login("wrong", "1.2.3.4") is None
    made = store.login("s3cret-token", "1.2.3.4")
    assert made is not None
    value, session = made
    assert store.get(value) == session and store.csrf_ok(session, session.csrf)
    assert not store.csrf_ok(session, "x") and not store.csrf_ok(None, session.csrf)
    now[0] += 61
    assert store.get(value) is None
    for _ in range(300):
        store.login("s3cret-token", "flood")
    assert len(store._sessions) <= 256
    assert SessionStore(None).login("anything", "x") is None


async def test_a_hung_state_that_lasted_a_millisecond_is_on_the_page(
    make_app: Callable[..., FastAPI], journal: Journal
) -> None:
    stamps = iter([1000.0, 1000.001, 1002.5, 1060.0])
    j = Journal(journal.path, wall=lambda: next(stamps))
    j.append("state_changed", old="ready", new="hung", reason="no progress for 30 s")
    j.append("state_changed", old="hung", new="diagnosing", reason="capturing")
    j.append("state_changed", old="diagnosing", new="restarting", reason="stopping after serving_stall")
    j.append("state_changed", old="restarting", new="starting", reason="launched rung base")
    async with browser(make_app()) as c:
        html = (await c.get("/ui")).text
    strip = html[html.index("<div id='states'>") :]
    assert "data-state='hung'" in strip and "1 ms" in strip and "no progress for 30 s" in strip
    assert strip.index("data-state='hung'") < strip.index("data-state='diagnosing'")


async def test_a_session_admits_only_the_origin_it_was_made_on(make_app: Callable[..., FastAPI], token: str) -> None:
    """Issue 50: a browser sends the cookie to every port of the host; presented with another Host
    (another port, or another name), the session admits nothing."""
    app = make_app(token=token)
    async with browser(app) as c:
        r = await c.post("/ui/login", content=f"token={token}".encode(), headers=FORM)
        value = r.headers["set-cookie"].split(";", 1)[0]
        assert (await c.get("/ui")).status_code == 200
    for host in ("127.0.0.1:3000", "localhost:8900", "127.0.0.1"):
        async with browser(app) as other:
            headers = {"Cookie": value, "Host": host}
            assert (await other.get("/ui", headers=headers)).status_code == 401, host
            assert (await other.get("/status", headers=headers)).status_code == 401, host
    async with browser(app) as same:
        assert (await same.get("/status", headers={"Cookie": value})).status_code == 200
