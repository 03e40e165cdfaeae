"""What the routes declare with `Depends`: the supervisor handle, the API's context, the token.

`create_app` puts the handle and the context on `app.state`; routes never reach for them any
other way, so a test swaps either through `app.dependency_overrides[get_supervisor]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry

from api.auth import CHALLENGE, UNAUTHORIZED_DETAIL, authorized, session_reads, who
from api.browser import simple_post
from api.loginguard import LoginGuard
from api.pool import ApiPool
from api.session import SessionStore
from api.streams import FollowSlots
from supervisor.status.commands import SupervisorHandle
from supervisor.status.journal import Journal
from supervisor.status.timeline import Timeline

# The scheme /openapi.json publishes; auto_error=False so a refusal has this API's error shape.
bearer_scheme = HTTPBearer(scheme_name="bearer", auto_error=False)


DEFAULT_PROBE_PATHS = frozenset({"/health", "/metrics", "/get_server_info"})


@dataclass(frozen=True)
class ApiContext:
    """Everything but the supervisor that the routes read: where bundles, the journal and logs are."""

    diag_dir: Path
    journal: Journal
    registry: CollectorRegistry
    redact: Callable[[str], str]  # applied to every server log line a route shows
    liveness: Callable[[], float] | None = None  # age in seconds of the loop's last heartbeat
    liveness_max_age_s: float = 30.0
    log_file: Path | None = None  # the server's output for GET /logs; None: no /logs route
    timeline: Timeline | None = None
    token: str | None = None
    pool: ApiPool = field(default_factory=ApiPool)  # the API's file reads, off the loop's executor
    follows: FollowSlots = field(default_factory=FollowSlots)  # open follow streams, capped
    scrapes: ScrapeCache = field(default_factory=lambda: ScrapeCache())  # /metrics, rendered once per window
    sessions: SessionStore | None = None  # the page's login sessions (api/session.py)
    logins: LoginGuard = field(default_factory=LoginGuard)  # refused logins: throttled, coalesced
    # The paths the daemon itself polls on the server: their access lines are hidden (api/logview.py).
    probe_paths: frozenset[str] = DEFAULT_PROBE_PATHS

    @property
    def server_log(self) -> Path:
        """The server log the status page tails (the state directory's logs/server.log by default)."""
        return self.log_file if self.log_file is not None else self.diag_dir.parent / "logs" / "server.log"


class ScrapeCache:
    """`/metrics` rendered at most once per `window_s`: a render costs ~13 ms of the loop, and 260
    connections pipelining scrapes kept the loop rendering (issue 33). Prometheus scrapes every few
    seconds at most, so a scrape sees values at most `window_s` old."""

    def __init__(self, window_s: float = 1.0) -> None:
        self.window_s = window_s
        self._at: float | None = None
        self._body = b""

    def get(self, render: Callable[[], bytes], now: float) -> bytes:
        if self._at is None or now - self._at >= self.window_s or now < self._at:
            self._body, self._at = render(), now
        return self._body


def get_supervisor(request: Request) -> SupervisorHandle:
    handle: SupervisorHandle | None = getattr(request.app.state, "supervisor", None)
    if handle is None:
        raise HTTPException(503, "no supervisor is attached to this API yet")
    return handle


def get_context(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.context
    return ctx


Supervisor = Annotated[SupervisorHandle, Depends(get_supervisor)]
Context = Annotated[ApiContext, Depends(get_context)]


def require_token(
    request: Request,
    ctx: Context,
    _scheme: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)],
) -> None:
    """The routes' own token check, and what declares the bearer scheme in /openapi.json.

    `BearerAuth` (api/auth.py) refuses a bad token before the body is read, and answers for paths
    that are no route; this check holds a route shut wherever that middleware is not in front.
    Both use `auth.authorized`, so they cannot disagree.
    """
    if ctx.token is None or session_reads(request.scope, ctx.sessions):
        return
    if not authorized(request.scope, ctx.token.encode("utf-8")):
        raise HTTPException(401, UNAUTHORIZED_DETAIL, headers={"WWW-Authenticate": CHALLENGE})


def requester(request: Request, ctx: Context) -> str:
    """Who asked (journalled with each command): the bearer, a page session or anonymous, and from where."""
    return who(request.scope, ctx.sessions, ctx.token)


Requester = Annotated[str, Depends(requester)]


def non_simple(request: Request) -> None:
    """A state-changing route: refuse a POST that a web page could send (api/browser.py), 415."""
    why = simple_post(request.scope)
    if why is not None:
        raise HTTPException(415, why)


async def no_unknown_query(request: Request) -> None:
    """A misspelt query parameter (`?limt=5`) is an error, as an unknown body field is."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    allowed = {p.alias for p in dependant.query_params} if dependant is not None else set()
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        raise RequestValidationError(
            [{"type": "extra_forbidden", "loc": ("query", name), "msg": "unknown query parameter"} for name in unknown]
        )
