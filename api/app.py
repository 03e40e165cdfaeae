"""The REST API: thin routes over the supervisor's snapshot and command queue.

`create_app` assembles the middleware, the error handlers and the routers (api/routes/, one per
concern); routes take the supervisor handle through `Depends(get_supervisor)` and never touch
processes. docs/API.md documents every route.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Security
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import page
from api.auth import BearerAuth
from api.browser import BrowserGuard, HostPolicy
from api.deps import DEFAULT_PROBE_PATHS, ApiContext, bearer_scheme, no_unknown_query, require_token
from api.errors import http_exception_handler, validation_exception_handler
from api.middleware import BodyLimit, InternalErrors
from api.responses import UNAUTHORIZED
from api.routes import commands, diagnostics, events, logs, probes, status
from api.session import SessionStore
from supervisor.common.redact import Redactor
from supervisor.status.commands import SupervisorHandle
from supervisor.status.journal import Journal
from supervisor.status.timeline import Timeline

DEFAULT_LIVENESS_MAX_AGE_S = 30.0


def create_app(
    handle: SupervisorHandle | None,
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
    hosts: HostPolicy | None = None,
    probe_paths: frozenset[str] | None = None,
) -> FastAPI:
    """The API app over `handle` (None: none attached yet; tests override `get_supervisor`).

    `liveness` returns the age in seconds of the supervisor loop's last heartbeat; `log_file` is
    the server's output for `GET /logs` (no such route without it), shown through `redact`.
    `hosts`: the names it answers to (api/browser.py; None: any Host, for an app without a socket).
    """
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
        dependencies=[Depends(no_unknown_query)],
    )
    app.state.supervisor = handle
    app.state.context = ApiContext(
        diag_dir=diag_dir,
        journal=journal,
        registry=registry,
        redact=redact or Redactor().text,
        liveness=liveness,
        liveness_max_age_s=liveness_max_age_s,
        log_file=log_file,
        timeline=timeline,
        token=token,
        sessions=SessionStore(token),
        probe_paths=probe_paths if probe_paths is not None else DEFAULT_PROBE_PATHS,
    )
    app.add_exception_handler(StarletteHTTPException, http_exception_handler)
    app.add_exception_handler(RequestValidationError, validation_exception_handler)
    # Added innermost first: InternalErrors wraps BearerAuth wraps BrowserGuard wraps BodyLimit wraps
    # the routes: a request without the token learns nothing but 401; one that has it (or comes to the
    # page, or to a daemon without a token) is then checked for Host, Origin and a simple body.
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(BrowserGuard, policy=hosts)
    app.add_middleware(BearerAuth, token=token, sessions=app.state.context.sessions)
    app.add_middleware(InternalErrors)

    include_protected(app, status.router)
    include_protected(app, commands.router)
    include_protected(app, diagnostics.router)
    include_protected(app, events.router)
    app.include_router(probes.router)  # open: /livez, /readyz, /metrics
    if log_file is not None:
        include_protected(app, logs.router)
    # The status page checks its own way in (a login form without credentials, api/page.py); with a
    # token the schema still declares the bearer scheme on it.
    if token is None:
        app.include_router(page.router)
    else:
        app.include_router(page.router, dependencies=[Security(bearer_scheme)], responses=dict(page.LOGIN_FORM))
    return app


def include_protected(app: FastAPI, router: APIRouter) -> None:
    """Include `router` behind the token: with one configured, its routes check it (`require_token`)
    and /openapi.json shows the bearer scheme and the 401 on each. The way to add a router later,
    e.g. the daemon's group routes."""
    context: ApiContext = app.state.context
    if context.token is None:
        app.include_router(router)
        return
    app.include_router(router, dependencies=[Security(require_token)], responses=UNAUTHORIZED)
