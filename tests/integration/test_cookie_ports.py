"""Issue 50: a browser sends the page's session cookie to every port of the host. In a real
Chromium logged in to the running daemon, a service on another loopback port receives the cookie;
its page's form post to the API is refused for its origin (another port), and replaying what it
received as it received it (its own `Host`) opens nothing: a session admits only the origin it was
made on. Before the fix the origin check ignored ports and the session admitted any `Host`."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("chromium") is None, reason="chromium not installed (Debian: apt-get install chromium)"
    ),
]

TOKEN = "cookie-ports-token-" + "p" * 24


class OtherService:
    """Another web service on this host's loopback: records what browsers send it; its page holds a
    form that posts a guess to the API's login."""

    def __init__(self, api: str) -> None:
        self.seen: list[dict[str, str]] = []
        page = (
            "<html><body><p>another service</p>"
            f"<form id='f' method='post' action='{api}/ui/login'>"
            "<input name='token' value='guess-from-another-port-0123'></form></body></html>"
        ).encode()
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


async def test_a_cookie_that_reaches_another_port_opens_nothing_from_there(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from cdp import Chromium

    s = sim("ok", tp=1)
    r = await daemon(s, {**os.environ, s.api.token_env: TOKEN})
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")
    other = OtherService(r.api)

    def drive() -> dict[str, object]:
        b = Chromium(tmp_path / "profile")
        try:
            b.goto(f"{r.api}/ui")
            b.js(f"document.getElementById('token').value = {TOKEN!r}")
            b.submit("document.getElementById('login').click()")
            seen: dict[str, object] = {"logged_in": b.js("!!document.getElementById('state')")}
            b.goto(f"{other.url}/")  # the person visits another local service
            b.submit("document.getElementById('f').submit()")  # its page posts to the API
            seen["answer"] = b.js("document.body.innerText")
            b.goto(f"{r.api}/ui")  # the person's own session still works on the API's origin
            seen["still_in"] = b.js("!!document.getElementById('state')")
            return seen
        finally:
            b.close()

    try:
        seen = await asyncio.to_thread(drive)
    finally:
        other.close()
    assert seen["logged_in"] is True and seen["still_in"] is True
    got = other.seen[0]
    assert "sgs_session=" in got.get("cookie", ""), "browsers share a host's cookies across its ports"
    assert "cross_origin" in str(seen["answer"]), seen["answer"]
    # The other service replays what the browser sent it, as it came (its own Host): nothing opens.
    replay = {"Cookie": got["cookie"], "Host": got["host"]}
    async with httpx.AsyncClient(base_url=r.api, timeout=10) as c:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        refused = await c.get("/events", params={"event": "page_login_refused"}, headers=bearer)
        assert refused.json()["events"] == [], "the other port's post never reached the login"
        page = await c.get("/ui", headers=replay)
        assert page.status_code == 401 and "name='token'" in page.text
        assert (await c.get("/status", headers=replay)).status_code == 401
