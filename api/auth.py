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

OPEN_PATHS = frozenset({"/livez", "/readyz", "/metrics"})
UNAUTHORIZED_DETAIL = "missing or invalid bearer token"
CHALLENGE = 'Bearer realm="sglang-supervisor"'  # the WWW-Authenticate header of a 401


class BearerAuth:
    """ASGI middleware: every HTTP request but the open probes needs `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str | None, open_paths: Collection[str] = OPEN_PATHS) -> None:
        self.app = app
        self._token = token.encode("utf-8") if token is not None else None
        self._open = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._token is None or scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] in self._open:
            await self.app(scope, receive, send)
            return
        if authorized(scope, self._token):
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
