"""`GET /ui`: the status page for a person, served by the daemon. Server-rendered HTML, no script,
no CDN; it reloads itself every few seconds.

With a token configured, `GET /ui` without credentials answers a login form; `POST /ui/login`
(form field `token`) sets the session cookie (api/session.py), `POST /ui/logout` ends it. A script
keeps sending the bearer header. The page's actions (restart, stop, start, diagnose) are forms to
`POST /ui/action`: each asks for a confirmation first, carries the session's CSRF token, and the
command is journalled with who asked.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Query, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from api import bundles, logview, promote
from api.auth import CHALLENGE, authorized, who
from api.deps import ApiContext, Context, Supervisor
from api.loginguard import Refusal
from api.pageforms import POSTABLE, confirm_page, done_page, login_page
from api.pagehtml import PageData, render
from api.session import SESSION_COOKIE, Session, clear_cookie_header, cookie, request_host, set_cookie_header
from supervisor.status.commands import Command, SupervisorHandle

LOG_TAIL_LINES = 60
LOG_TAIL_BYTES = 256 * 1024  # read from the end of the log files: a line flood cannot slow the page
MAX_BUNDLES = 10
STATE_CHANGES = 16  # the "Recent states" strip
# A page with server log lines in it: nothing may load or run, whatever a line contains.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "same-origin",  # not no-referrer: that makes a browser send `Origin: null` on the forms
}

router = APIRouter(tags=["status"])


def tail_lines(path: Path, n: int, max_bytes: int = LOG_TAIL_BYTES) -> list[str]:
    """The file's last `n` lines within its last `max_bytes`; none when it is missing or unreadable."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return []
    # A progress bar rewrites its line with carriage returns: show each line as a terminal would.
    lines = [ln.rstrip("\r").rsplit("\r", 1)[-1] for ln in data.decode("utf-8", "replace").split("\n")]
    if len(data) >= max_bytes and lines:
        lines = lines[1:]  # the first may be cut
    return [ln[:500] for ln in lines if ln.strip()][-n:]


def page_log(ctx: ApiContext, show_all: bool) -> list[str]:
    """The log panel's lines: the daemon's own polls hidden unless `show_all`, each launch's start
    marked (api/logview.py); a progress bar's line as a terminal shows it; each cut at 500."""
    keep = logview.probe_filter(ctx.probe_paths, show_all)
    known = logview.launches(ctx.journal)
    raw = logview.marked_tail(ctx.server_log, LOG_TAIL_LINES, known, keep, budget=LOG_TAIL_BYTES)
    text = (line.decode("utf-8", "replace").rsplit("\r", 1)[-1][:500] for line in raw)
    return [ctx.redact(t) for t in text if t.strip()]


def _gather(
    handle: SupervisorHandle, ctx: ApiContext, csrf: str = "", session: bool = False, show_all: bool = False
) -> PageData:
    listed = bundles.list_bundles(ctx.diag_dir)[:MAX_BUNDLES]
    lines = page_log(ctx, show_all)
    return PageData(
        snapshot=handle.snapshot(),
        bundles=[(b.id, b.summary) for b in listed],
        log_lines=lines,
        timeline=ctx.timeline.points() if ctx.timeline is not None else (),
        transitions=ctx.journal.read(STATE_CHANGES, lambda r: r.get("event") == "state_changed"),
        csrf=csrf,
        session=session,
        all_logs=show_all,
        now=time.time(),
    )


class Viewer:
    """Who is looking: a bearer (script), a page session, or anyone when no token is configured."""

    def __init__(self, request: Request, ctx: ApiContext) -> None:
        self.session: Session | None = ctx.sessions.from_scope(request.scope) if ctx.sessions else None
        bearer = ctx.token is not None and authorized(request.scope, ctx.token.encode("utf-8"))
        self.allowed = ctx.token is None or bearer or self.session is not None
        self.csrf = ctx.sessions.csrf_for(self.session) if ctx.sessions is not None else ""


def _html(body: str, status: int = 200) -> HTMLResponse:
    headers = {**HEADERS, "WWW-Authenticate": CHALLENGE} if status == 401 else HEADERS
    return HTMLResponse(body, status_code=status, headers=headers)


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded form (BodyLimit has capped it); the first value of each field."""
    text = (await request.body()).decode("utf-8", "replace")
    return {k: v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}


def _secure(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "") == "https"


LOGIN_FORM: dict[int | str, dict[str, Any]] = {
    401: {"description": "the login form (a token is configured)", "content": {"text/html": {}}}
}


@router.get("/ui", response_class=HTMLResponse, responses={200: {"content": {"text/html": {}}}})
async def status_page(
    request: Request,
    handle: Supervisor,
    ctx: Context,
    # `logs=all`: the log panel shows the daemon's polls too; any other value is the default (a page
    # answers its login form, not a 422, to a request without credentials).
    logs: Annotated[str | None, Query(include_in_schema=False)] = None,
) -> HTMLResponse:
    """The status page: state, ladder, incidents with their bundles, the log tail, the start-up
    timeline; without credentials (a token configured), the login form."""
    viewer = Viewer(request, ctx)
    if not viewer.allowed:
        return _html(login_page(""), 401)
    data = await ctx.pool.run(_gather, handle, ctx, viewer.csrf, viewer.session is not None, logs == "all")
    return _html(render(data))


# A load balancer's or a person's `curl -I` check of the page answers as GET does (200), not 405.
@router.head("/ui", include_in_schema=False, response_class=HTMLResponse)
async def status_page_head(request: Request, handle: Supervisor, ctx: Context) -> HTMLResponse:
    return await status_page(request, handle, ctx, None)


@router.post("/ui/login", include_in_schema=False, response_class=HTMLResponse, status_code=303)
async def login(request: Request, ctx: Context) -> Response:
    """Form field `token`: the API token. Right: a session cookie and back to /ui; wrong: the form again."""
    if ctx.sessions is None or not ctx.sessions.needs_login:
        return RedirectResponse("/ui", status_code=303)
    form = await _form(request)
    client = request.client.host if request.client else "?"
    wait_s = ctx.logins.admit(client)
    made = ctx.sessions.login(form.get("token", ""), client, request_host(request.scope)) if wait_s == 0.0 else None
    if made is None:
        due = ctx.logins.refused(client, throttled=wait_s > 0.0)
        if due is not None:
            await ctx.pool.run(_journal_refusals, ctx, due)
        if wait_s > 0.0:
            retry = max(1, math.ceil(wait_s))
            page = _html(login_page(f"too many refused logins from {client}; try again in {retry} s"), 429)
            page.headers["Retry-After"] = str(retry)
            return page
        return _html(login_page("that is not the token of this daemon"), 401)
    value, session = made
    held = ctx.logins.flush(client)
    if held is not None:
        await ctx.pool.run(_journal_refusals, ctx, held)
    await ctx.pool.run(ctx.journal.append, "page_login", session=session.name, client=client)
    out = RedirectResponse("/ui", status_code=303)
    out.headers["Set-Cookie"] = set_cookie_header(value, ctx.sessions.ttl_s, _secure(request))
    out.headers["Cache-Control"] = "no-store"
    return out


def _journal_refusals(ctx: ApiContext, due: Refusal) -> None:
    ctx.journal.append("page_login_refused", client=due.client, count=due.count, throttled=due.throttled)


@router.post("/ui/logout", include_in_schema=False, response_class=HTMLResponse, status_code=303)
async def logout(request: Request, ctx: Context) -> Response:
    """End this browser's session (form field `csrf`), whatever its expiry."""
    form = await _form(request)
    viewer = Viewer(request, ctx)
    if ctx.sessions is not None and viewer.session is not None:
        if not ctx.sessions.csrf_ok(viewer.session, form.get("csrf", "")):
            return _html(login_page("the form was stale; log out again from the page"), 403)
        ctx.sessions.logout(cookie(request.scope, SESSION_COOKIE))
        await ctx.pool.run(ctx.journal.append, "page_logout", session=viewer.session.name)
    out = RedirectResponse("/ui", status_code=303)
    out.headers["Set-Cookie"] = clear_cookie_header()
    return out


@router.post("/ui/action", include_in_schema=False, response_class=HTMLResponse)
async def action(request: Request, handle: Supervisor, ctx: Context) -> Response:
    """A page button: `action` (restart, stop, start, diagnose, promote) and `csrf`; the first post answers a
    confirmation page, the second (`confirm=yes`) submits the command, journalled with who asked."""
    viewer = Viewer(request, ctx)
    if not viewer.allowed:
        return _html(login_page("log in first"), 401)
    form = await _form(request)
    if ctx.sessions is None or not ctx.sessions.csrf_ok(viewer.session, form.get("csrf", "")):
        return _html(done_page("refused: the form's CSRF token is missing or stale; reload the page"), 403)
    kind = form.get("action", "")
    if kind not in POSTABLE:
        return _html(done_page(f"refused: no action {kind[:40]!r}; the page offers {', '.join(POSTABLE)}"), 400)
    snap = handle.snapshot()
    refused = promote.refusal(snap) if kind == "promote" else None
    if refused is not None:
        return _html(done_page(f"promote: refused ({refused.message})"), refused.status)
    if form.get("confirm") != "yes":
        return _html(confirm_page(kind, viewer.csrf, snap))
    by = who(request.scope, ctx.sessions, ctx.token)
    reason = f"from the status page ({by})"
    if kind == "promote":  # a manual restart onto the preferred rung, as `POST /promote` sends it
        command = Command(kind="restart", rung=snap.ladder[0], reason=f"promote {reason}", requested_by=by)
    else:
        command = Command(kind=kind, reason=reason if kind != "diagnose" else "", requested_by=by)  # type: ignore[arg-type]
    result = await handle.submit(command)
    ok = result.outcome in ("accepted", "done")
    message = promote.accepted_message(snap) if kind == "promote" and ok else result.message
    text = f"{kind}: {result.outcome}" + (f" ({message})" if message else "")
    return _html(done_page(text), 200 if ok else 409)
