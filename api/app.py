"""The REST API: thin routes over the supervisor's snapshot and command queue.

Routes read `handle.snapshot()` and `await handle.submit(Command(...))`; they never touch
processes. File and journal reads run in worker threads, so `/status` and `/metrics` answer in
milliseconds while a capture or a stop is under way. docs/API.md documents every route.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from pydantic import BeforeValidator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse

from api import bundles, page, streams
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
    StartRequest,
    StopRequest,
)
from supervisor.daemon.commands import Command, CommandResult, SupervisorHandle
from supervisor.daemon.journal import Journal
from supervisor.daemon.snapshot import StatusSnapshot
from supervisor.daemon.timeline import Timeline
from supervisor.diagnostics.redact import Redactor
from supervisor.group.view import snapshot_ready
from supervisor.policy.lifecycle import SERVING

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


EventName = streams.EventName  # snake_case journal event names (api/streams.py)


def _journal_time(text: str) -> datetime | None:
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))  # the journal writes UTC with "Z"
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


_RFC3339 = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)")


def _rfc3339(value: object) -> object:
    """Only a full date-time with its offset: pydantic alone would also take `0.5` as a Unix time."""
    if not isinstance(value, str) or not _RFC3339.fullmatch(value.strip()):
        raise ValueError("expected an RFC 3339 time with an offset, e.g. 2026-11-30T12:00:00Z")
    return value.strip()


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
    log_file: Path | None = None,
    timeline: Timeline | None = None,
    redact: Callable[[str], str] | None = None,
) -> FastAPI:
    """The API app. `liveness` returns the age in seconds of the supervisor loop's last heartbeat;
    `log_file` is the server's output for `GET /logs`, shown through `redact` (secrets out)."""
    app = FastAPI(
        title="sglang-supervisor",
        version=version or "0",
        description="Supervises an SGLang server: status, restarts, diagnostics, events, metrics.",
        # No interactive /docs or /redoc: FastAPI's pages load their scripts from a CDN (dead on an
        # offline GPU host) and a browser cannot send the bearer token to load them. /openapi.json
        # stays; docs/API.md says how to browse it locally.
        docs_url=None,
        redoc_url=None,
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
        hung = (result.summary or {}).get("trigger") == "hung"
        state = result.state or handle.snapshot().state
        message = result.message
        if not hung:
            message += (
                f"; the server is not hung (state {state}): the stacks show where its threads wait, no hang class"
            )
        return DiagnoseResult(
            bundle_id=result.bundle_id, summary=result.summary, message=message, state=state, hung=hung
        )

    async def simple(command: Command) -> Any:
        result, refusal = await submit(command)
        if refusal is not None:
            return refusal
        return CommandAccepted(state=result.state or handle.snapshot().state, message=result.message)

    @app.post(
        "/stop", status_code=202, response_model=CommandAccepted, responses={**_ERR, **_CONFLICT}, tags=["commands"]
    )
    async def stop(body: Annotated[StopRequest | None, Body()] = None) -> Any:
        """Stop the server tree and stay stopped until `POST /start`; already stopped is a 202 too."""
        return await simple(Command(kind="stop", reason=(body or StopRequest()).reason))

    @app.post(
        "/start",
        status_code=202,
        response_model=CommandAccepted,
        responses={**_ERR, **_CONFLICT, **_NO_RUNG},
        tags=["commands"],
    )
    async def start(body: Annotated[StartRequest | None, Body()] = None) -> Any:
        """Start the server after a stop, or out of `failed`."""
        rung = (body or StartRequest()).rung
        ladder = handle.snapshot().ladder
        if rung is not None and ladder and rung not in ladder:
            return _unknown_rung(rung, ladder)
        return await simple(Command(kind="start", rung=rung))

    @app.post("/reload", response_model=CommandAccepted, responses={**_ERR, **_CONFLICT}, tags=["commands"])
    async def reload() -> Any:
        """Re-read the config file, as SIGHUP does; a config that does not validate is a 400 and the old one stays."""
        result, refusal = await submit(Command(kind="reload", source="api"))
        if refusal is not None:
            return refusal
        return CommandAccepted(state=result.state or handle.snapshot().state, message=result.message)

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

    @app.get("/events", response_model=EventList, responses={422: _ERR[422]}, tags=["status"])
    async def events(
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        event: Annotated[
            list[EventName] | None, Query(max_length=64, description="only these events (repeatable)")
        ] = None,
        since: Annotated[
            datetime | None,
            BeforeValidator(_rfc3339),
            Query(description="only events at or after this RFC 3339 time, e.g. 2026-11-30T12:00:00Z"),
        ] = None,
        # Not in the schema: an OpenAPI client (or fuzzer) cannot consume an answer that never ends.
        follow: Annotated[bool, Query(include_in_schema=False)] = False,
    ) -> Any:
        """The journal's last `limit` events (of the kinds `event`, from `since`), oldest first."""
        start = since
        names = frozenset(event or ())
        unknown = streams.unknown_event_response(names)
        if unknown is not None:
            return unknown
        follower = await streams.start_following(journal.path) if follow else None

        def match(record: dict[str, object]) -> bool:
            if names and record.get("event") not in names:
                return False
            if start is None:
                return True
            at = _journal_time(str(record.get("ts", "")))
            return at is not None and at >= start

        found = await asyncio.to_thread(journal.read, limit, match if names or start else None)
        if follower is not None:
            return streams.follow_events(follower, found, match, streams.FOLLOW_POLL_S)
        return EventList(events=found)

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
        snap = handle.snapshot()
        body = Readiness(ready=snapshot_ready(snap), state=snap.state)  # a group's leader: the group serves
        return body if body.ready else JSONResponse(body.model_dump(mode="json"), status_code=503)

    if log_file is not None:
        app.include_router(streams.logs_router(log_file, redact or (lambda text: text)))
    # The status page (api/page.py): same auth as /status, through the same middleware.
    app.state.page = page.PageContext(
        handle, diag_dir, diag_dir.parent / "logs" / "server.log", timeline, redact or Redactor().text
    )
    app.include_router(page.router)
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
                unauthorized = {
                    "description": "missing or invalid bearer token",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                }
                for path, ops in schema.get("paths", {}).items():
                    for op in ops.values():
                        if path in OPEN_PATHS:
                            op["security"] = []  # explicitly open, whatever a global default says
                            continue
                        op["security"] = [{"bearer": []}]
                        op.setdefault("responses", {})["401"] = unauthorized
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
