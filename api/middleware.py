"""ASGI middleware that guards the routes: a cap on request bodies, and no 500s.

`BodyLimit` reads the whole body before any route sees it (the cap is small, 64 KiB by default),
so a lying or absent Content-Length cannot stream more than the cap into the daemon.
`InternalErrors` turns a bug into a logged 503 with a JSON reason: the daemon keeps serving, and
the bug stays visible in the log and to the caller.
"""

from __future__ import annotations

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import send_error

log = structlog.get_logger(__name__)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared == -1:
            await send_error(send, 400, "bad_request", "invalid Content-Length header")
            return
        if declared is not None and declared > self.max_bytes:
            await self._too_large(send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = bool(message.get("more_body", False))
            if len(body) > self.max_bytes:
                await self._too_large(send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        await send_error(send, 413, "too_large", f"the request body is over {self.max_bytes} bytes")


def _content_length(scope: Scope) -> int | None:
    """The declared length; -1 when the header is present but not a non-negative integer."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = bytes(value).strip()
            if not text.isdigit():
                return -1
            return int(text) if len(text) <= 18 else 10**18
    return None


class InternalErrors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log.exception("api_internal_error", method=scope.get("method"), path=scope.get("path"))
            if started:
                return  # part of the response is out; the server closes the connection
            detail = f"{type(exc).__name__}: {exc}"[:500]
            await send_error(send, 503, "internal", detail)
