"""One JSON shape for every error (`ErrorBody`), and the handlers that produce it.

Validation errors are reported without echoing the input back: it may be large, binary, or a
secret somebody pasted into the wrong field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.types import Send

from api.models import ErrorBody

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "busy",
    503: "unavailable",
}


def error_response(
    status: int,
    error: str,
    detail: object = None,
    *,
    state: str | None = None,
    rungs: Sequence[str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = ErrorBody(error=error, detail=detail, state=state, rungs=list(rungs) if rungs is not None else None)
    return JSONResponse(body.model_dump(mode="json", exclude_none=True), status_code=status, headers=headers)


async def send_error(send: Send, status: int, error: str, detail: str) -> None:
    """For pure ASGI middleware, which answers before any route runs."""
    body = json.dumps({"error": error, "detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def http_exception_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    error = _CODES.get(exc.status_code, "error")
    return error_response(exc.status_code, error, exc.detail, headers=exc.headers)


def _field_errors(errors: Sequence[Any]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for e in errors:
        loc = [p if isinstance(p, (int, str)) else str(p) for p in e.get("loc", ())]
        out.append({"loc": loc, "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    return out


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def validation_exception_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    for e in errors:
        if e.get("type") == "json_invalid":
            reason = (e.get("ctx") or {}).get("error", "not JSON")
            loc = e.get("loc", ())
            at = f" at position {loc[1]}" if len(loc) > 1 else ""
            return error_response(400, "malformed_json", f"the request body is not valid JSON: {reason}{at}")
    detail: object = _field_errors(errors)
    content_type = request.headers.get("content-type", "")
    body_refused = any(tuple(e.get("loc", ())) == ("body",) for e in errors)
    if body_refused and content_type and not _is_json(content_type):
        detail = (
            f"the body was sent as {content_type.split(';', 1)[0]!r}; send a JSON object "
            "with 'Content-Type: application/json'"
        )
    return error_response(422, "invalid", detail)
