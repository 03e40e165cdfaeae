"""The API's bearer token check: every route but the open probes needs it.

The token is compared as bytes in constant time and never logged or echoed. Where it comes from and
where the daemon may listen without one: supervisor.common.apitoken (the daemon, check-config and
the client read it the same way).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from api.session import SessionStore

OPEN_PATHS = frozenset({"/livez", "/readyz", "/metrics"})
# The page checks its own way in: without credentials /ui answers the login form (api/page.py).
PAGE_ROUTES = frozenset(
    {("GET", "/ui"), ("HEAD", "/ui"), ("POST", "/ui/login"), ("POST", "/ui/logout"), ("POST", "/ui/action")}
)
READ_METHODS = frozenset({"GET", "HEAD"})
UNAUTHORIZED_DETAIL = "missing or invalid bearer token"
CHALLENGE = 'Bearer realm="sglang-supervisor"'  # the WWW-Authenticate header of a 401


class BearerAuth:
    """ASGI middleware: every HTTP request but the open probes needs `Authorization: Bearer <token>`."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        open_paths: Collection[str] = OPEN_PATHS,
        sessions: SessionStore | None = None,
    ) -> None:
        self.app = app
        self._token = token.encode("utf-8") if token is not None else None
        self._open = frozenset(open_paths)
        self._sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._token is None or scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and (
            scope["path"] in self._open or (scope.get("method", ""), scope["path"]) in PAGE_ROUTES
        ):
            await self.app(scope, receive, send)
            return
        if authorized(scope, self._token) or session_reads(scope, self._sessions):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await _unauthorized(send)


def authorized(scope: Scope, token: bytes) -> bool:
    """Whether any `Authorization` header of the request is `Bearer <token>` (scheme in any case)."""
    for name, value in scope.get("headers", ()):
        if name.lower() != b"authorization":
            continue
        scheme, _, credentials = bytes(value).strip().partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token):
            return True
    return False


def session_reads(scope: Scope, sessions: SessionStore | None) -> bool:
    """Whether the page's session cookie admits this request: reads only (the links on the page);
    changes need the bearer token or the page's own forms with their CSRF token."""
    if sessions is None or scope.get("method", "GET").upper() not in READ_METHODS:
        return False
    return sessions.from_scope(scope) is not None


def who(scope: Scope, sessions: SessionStore | None, token: str | None) -> str:
    """Who asked, for the journal: `bearer`, `page session <name>` or `anonymous`, and the client."""
    client = scope.get("client")
    at = f" from {client[0]}" if client else ""
    if token is not None and authorized(scope, token.encode("utf-8")):
        return f"bearer token{at}"
    session = sessions.from_scope(scope) if sessions is not None else None
    if session is not None:
        return f"page session {session.name}{at}"
    return f"anonymous{at}"


async def _unauthorized(send: Send) -> None:
    body = json.dumps({"error": "unauthorized", "detail": UNAUTHORIZED_DETAIL}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", CHALLENGE.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
