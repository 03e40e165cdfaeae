"""The REST API: thin routes over the supervisor's snapshot and command queue.

Routes read `handle.snapshot()` and `await handle.submit(Command(...))`; they never touch
processes. File and journal reads run in worker threads, so `/status` and `/metrics` answer in
milliseconds while a capture or a stop is under way. docs/API.md documents every route.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse

from api import bundles
from api.auth import OPEN_PATHS, BearerAuth
from api.errors import error_response, http_exception_handler, validation_exception_handler
from api.middleware import BodyLimit, InternalErrors
from api.models import (
    BundleDetail,
    BundleList,
    CommandAccepted,
    DiagnoseRequest,
    DiagnoseResult,
    ErrorBody,
    EventList,
    Liveness,
    Readiness,
    RestartAccepted,
    RestartRequest,
)
from supervisor.commands import Command, CommandKind, CommandResult, SupervisorHandle
from supervisor.journal import Journal
from supervisor.snapshot import StatusSnapshot
from supervisor.state import SERVING

SERVING_STATES = frozenset(s.value for s in SERVING)
DEFAULT_LIVENESS_MAX_AGE_S = 30.0
BUSY_RETRY_AFTER_S = 5

_ERR: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": why}
    for code, why in (
        (400, "malformed JSON or a request the supervisor refuses, with the reason"),
        (413, "the request body is over the size cap"),
        (422, "wrong field names or types"),
        (503, "the supervisor could not carry it out, or an internal error (logged)"),
    )
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "conflicts with what is under way; `state` says what"},
    429: {"model": ErrorBody, "description": "the supervisor is busy with the same work; retry later"},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody, "description": "no such bundle or file"}}
_NO_RUNG: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "no such rung; `rungs` lists the ladder"}
}


def _refusal(result: CommandResult, snapshot: StatusSnapshot) -> JSONResponse | None:
    """The error response for an outcome other than accepted/done, or None for success."""
    state = result.state or snapshot.state
    if result.outcome in ("accepted", "done"):
        return None
    if result.outcome == "conflict":
        return error_response(409, "conflict", result.message or f"conflicts with state {state}", state=state)
    if result.outcome == "busy":
        return error_response(
            429,
            "busy",
            result.message or "the supervisor is busy with the same work",
            state=state,
            headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
        )
    if result.outcome == "invalid":
        return error_response(
            400, "invalid", result.message or "refused", state=state, rungs=list(snapshot.ladder) or None
        )
    return error_response(503, "failed", result.message or "the supervisor could not carry it out", state=state)


async def _no_unknown_query(request: Request) -> None:
    """A misspelt query parameter (`?limt=5`) is an error, as an unknown body field is."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    allowed = {p.alias for p in dependant.query_params} if dependant is not None else set()
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        raise RequestValidationError(
            [{"type": "extra_forbidden", "loc": ("query", name), "msg": "unknown query parameter"} for name in unknown]
        )


def _unknown_rung(rung: str, ladder: tuple[str, ...], message: str = "") -> JSONResponse:
    known = f"the ladder has: {', '.join(ladder)}" if ladder else "the ladder is not loaded yet"
    detail = f"{message or f'no rung named {rung!r}'}; {known}"
    return error_response(404, "unknown_rung", detail, rungs=list(ladder))


def create_app(
    handle: SupervisorHandle,
    *,
    token: str | None,
    diag_dir: Path,
    journal: Journal,
    registry: CollectorRegistry,
    max_body_bytes: int,
    liveness: Callable[[], float] | None = None,
    liveness_max_age_s: float = DEFAULT_LIVENESS_MAX_AGE_S,
    version: str = "",
) -> FastAPI:
    """The API app. `liveness` returns the age in seconds of the supervisor loop's last heartbeat."""
    app = FastAPI(
        title="sglang-supervisor",
        version=version or "0",
        description="Supervises an SGLang server: status, restarts, diagnostics, events, metrics.",
        responses={401: {"model": ErrorBody, "description": "missing or invalid bearer token"}} if token else {},
        strict_content_type=False,
        dependencies=[Depends(_no_unknown_query)],
    )
    app.add_exception_handler(StarletteHTTPException, http_exception_handler)
    app.add_exception_handler(RequestValidationError, validation_exception_handler)
    # Added innermost first: InternalErrors wraps BearerAuth wraps BodyLimit wraps the routes.
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(BearerAuth, token=token)
    app.add_middleware(InternalErrors)

    async def submit(command: Command) -> tuple[CommandResult, JSONResponse | None]:
        result = await handle.submit(command)
        return result, _refusal(result, handle.snapshot())

    @app.get("/status", response_model=StatusSnapshot, tags=["status"])
    async def status() -> StatusSnapshot:
        return handle.snapshot()

    @app.post(
        "/restart",
        status_code=202,
        response_model=RestartAccepted,
        responses={**_ERR, **_CONFLICT, **_NO_RUNG},
        tags=["commands"],
    )
    async def restart(body: Annotated[RestartRequest | None, Body()] = None) -> Any:
        """Restart the server (stop, verify release, relaunch), optionally on a given rung."""
        req = body or RestartRequest()
        ladder = handle.snapshot().ladder
        if req.rung is not None and ladder and req.rung not in ladder:
            return _unknown_rung(req.rung, ladder)
        result, refusal = await submit(Command(kind="restart", rung=req.rung, reason=req.reason, diagnose=req.diagnose))
        ladder = handle.snapshot().ladder
        if result.outcome == "invalid" and req.rung is not None and req.rung not in ladder:
            return _unknown_rung(req.rung, ladder, result.message)
        if refusal is not None:
            return refusal
        state = result.state or handle.snapshot().state
        return RestartAccepted(incident_id=result.incident_id, state=state, message=result.message)

    @app.post("/diagnose", response_model=DiagnoseResult, responses={**_ERR, **_CONFLICT}, tags=["commands"])
    async def diagnose(body: Annotated[DiagnoseRequest | None, Body()] = None) -> Any:
        """Capture evidence now; answers when the bundle is written."""
        req = body or DiagnoseRequest()
        result, refusal = await submit(Command(kind="diagnose", native=req.native, gdb=req.gdb))
        if refusal is not None:
            return refusal
        return DiagnoseResult(bundle_id=result.bundle_id, summary=result.summary, message=result.message)

    async def simple(kind: CommandKind) -> Any:
        result, refusal = await submit(Command(kind=kind))
        if refusal is not None:
            return refusal
        return CommandAccepted(state=result.state or handle.snapshot().state, message=result.message)

    @app.post(
        "/stop", status_code=202, response_model=CommandAccepted, responses={**_ERR, **_CONFLICT}, tags=["commands"]
    )
    async def stop() -> Any:
        """Stop the server tree and stay stopped until `POST /start`."""
        return await simple("stop")

    @app.post(
        "/start", status_code=202, response_model=CommandAccepted, responses={**_ERR, **_CONFLICT}, tags=["commands"]
    )
    async def start() -> Any:
        """Start the server after a stop, or out of `failed`."""
        return await simple("start")

    @app.get("/diagnostics", response_model=BundleList, tags=["diagnostics"])
    async def diagnostics() -> BundleList:
        """Diagnostic bundles, newest first, with their summaries."""
        return BundleList(bundles=await asyncio.to_thread(bundles.list_bundles, diag_dir))

    @app.get("/diagnostics/{bundle_id}", response_model=BundleDetail, responses=_NOT_FOUND, tags=["diagnostics"])
    async def diagnostic(bundle_id: str) -> Any:
        detail = await asyncio.to_thread(bundles.bundle_detail, diag_dir, bundle_id)
        if detail is None:
            return error_response(404, "not_found", "no such bundle")
        return detail

    @app.get(
        "/diagnostics/{bundle_id}/{name}",
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "the file's content",
                "content": {"text/plain": {"schema": {"type": "string"}}, "application/json": {}},
            },
            **_NOT_FOUND,
        },
        tags=["diagnostics"],
    )
    async def diagnostic_file(bundle_id: str, name: str) -> Response:
        fd = await asyncio.to_thread(bundles.open_bundle_file, diag_dir, bundle_id, name)
        if fd is None:
            return error_response(404, "not_found", "no such file in that bundle")
        return StreamingResponse(
            bundles.read_chunks(fd),
            media_type=bundles.media_type(name),
            headers={"X-Content-Type-Options": "nosniff"},
        )

    @app.get("/events", response_model=EventList, tags=["status"])
    async def events(limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> EventList:
        """The journal's last `limit` events, oldest first."""
        return EventList(events=await asyncio.to_thread(journal.read, limit))

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"description": "Prometheus text format 0.0.4", "content": {"text/plain": {}}}},
        tags=["probes"],
    )
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    @app.get(
        "/livez",
        response_model=Liveness,
        responses={503: {"model": Liveness, "description": "the supervisor loop is stuck"}},
        tags=["probes"],
    )
    async def livez() -> Any:
        """The daemon's own loop is alive (not whether the server is)."""
        handle.snapshot()
        if liveness is None:
            return Liveness(ok=True)
        age = liveness()
        if age > liveness_max_age_s:
            body = Liveness(
                ok=False,
                loop_heartbeat_age_s=age,
                detail=f"the supervisor loop has not run for {age:.1f} s (limit {liveness_max_age_s:g} s)",
            )
            return JSONResponse(body.model_dump(mode="json"), status_code=503)
        return Liveness(ok=True, loop_heartbeat_age_s=age)

    @app.get(
        "/readyz",
        response_model=Readiness,
        responses={503: {"model": Readiness, "description": "the server is not serving"}},
        tags=["probes"],
    )
    async def readyz() -> Any:
        """The server is serving: state `ready` or `degraded`."""
        state = handle.snapshot().state
        body = Readiness(ready=state in SERVING_STATES, state=state)
        return body if body.ready else JSONResponse(body.model_dump(mode="json"), status_code=503)

    _document_auth(app, token is not None)
    return app


def _document_auth(app: FastAPI, required: bool) -> None:
    """Publish the bearer scheme in /openapi.json on every route that needs it."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            if required:
                schema.setdefault("components", {})["securitySchemes"] = {
                    "bearer": {"type": "http", "scheme": "bearer"}
                }
                for path, ops in schema.get("paths", {}).items():
                    if path in OPEN_PATHS:
                        continue
                    for op in ops.values():
                        op["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
