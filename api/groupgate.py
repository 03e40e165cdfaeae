"""The member API's gate: `/group/*` is answered only to requests signed with this node's key, and
every answer is signed with it (supervisor/group/signing.py, docs/MULTINODE.md "Peer identity").

The gate sits outside the operator's API: `/group/*` never reaches the bearer-token app (the
leader holds no operator token to send), and no other path reaches the group routes. A request
that is unsigned, signed with another key, stale or replayed gets 401 with the reason, whatever
`[api]` says about tokens (an anonymous `POST /group/stop` on a tokenless loopback daemon included).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import group
from api.errors import http_exception_handler, send_error, validation_exception_handler
from api.group import GROUP_SIGNER
from api.middleware import InternalErrors
from supervisor.group.signing import RequestCheck, Signed, sign_answer

PREFIX = "/group"
MEMBER_PATHS = frozenset({"/group/report", "/group/capture", "/group/stop", "/group/launch"})
LEADER_PATHS = frozenset({"/group/join"})


def group_app(handle: group.GroupHandle) -> FastAPI:
    """The group routes alone, with the API's error shapes."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, strict_content_type=False)
    app.state.group = handle
    app.add_exception_handler(StarletteHTTPException, http_exception_handler)
    app.add_exception_handler(RequestValidationError, validation_exception_handler)
    app.add_middleware(InternalErrors)
    app.include_router(group.router)
    return app


def _is_group(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class GroupGate:
    """ASGI: `/group/*` to the signed group app, everything else to `app`."""

    def __init__(
        self,
        app: ASGIApp,
        members_app: ASGIApp,
        check: RequestCheck,
        *,
        wall: Callable[[], float],
        max_body_bytes: int,
        paths: frozenset[str],
    ) -> None:
        self.paths = paths  # the routes this daemon's role answers (a member's, or the leader's join)
        self.app = app
        self.members_app = members_app
        self.check = check
        self._wall = wall
        self._max = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not _is_group(scope["path"]):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body.extend(message.get("body", b""))
            if len(body) > self._max:
                await send_error(send, 413, "too_large", f"request body over {self._max} bytes")
                return
            more = bool(message.get("more_body"))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        method, path = scope["method"], scope["path"]
        signed = self.check(method, path, bytes(body), headers, self._wall())
        if isinstance(signed, str):
            await send_error(send, 401, "unauthorized", f"group request refused: {signed}")
            return
        if path not in self.paths:
            await send_error(send, 404, "not_found", f"{path}: not a route of this node's role in the group")
            return
        await self._answer({**scope, GROUP_SIGNER: signed.node}, bytes(body), signed, send)

    async def _answer(self, scope: Scope, body: bytes, signed: Signed, send: Send) -> None:
        nonce = signed.nonce
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.members_app(scope, replay, capture)
        if start is None:  # the app answered nothing: a bug, said as one
            data = json.dumps({"error": "internal", "detail": "no answer"}).encode()
            start = {"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"application/json")]}
            chunks = [data]
        data = b"".join(chunks)
        status = int(start["status"])
        key = self.check.key_for(signed.node)
        s = sign_answer(key, signed.node, scope["method"], scope["path"], nonce, status, data, self._wall())
        headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(data)).encode()))
        headers.extend((k.encode(), v.encode()) for k, v in s.headers().items())
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
