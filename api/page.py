"""`GET /ui`: a read-only status page for a person, served by the daemon (same bearer auth as
/status). Server-rendered HTML, no script, no CDN; it reloads itself every few seconds."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from fastapi import APIRouter
from starlette.responses import HTMLResponse

from api import bundles
from api.deps import ApiContext, Context, Supervisor
from api.pagehtml import PageData, render
from supervisor.status.commands import SupervisorHandle

LOG_TAIL_LINES = 60
LOG_TAIL_BYTES = 64 * 1024  # read from the end of the log file: a line flood cannot slow the page
MAX_BUNDLES = 10
# A page with server log lines in it: nothing may load or run, whatever a line contains.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
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


def _gather(handle: SupervisorHandle, ctx: ApiContext) -> PageData:
    listed = bundles.list_bundles(ctx.diag_dir)[:MAX_BUNDLES]
    lines = [ctx.redact(line) for line in tail_lines(ctx.server_log, LOG_TAIL_LINES)]
    return PageData(
        snapshot=handle.snapshot(),
        bundles=[(b.id, b.summary) for b in listed],
        log_lines=lines,
        timeline=ctx.timeline.points() if ctx.timeline is not None else (),
    )


@router.get("/ui", response_class=HTMLResponse, responses={200: {"content": {"text/html": {}}}})
async def status_page(handle: Supervisor, ctx: Context) -> HTMLResponse:
    """The status page: state, ladder, incidents with their bundles, the log tail, the start-up timeline."""
    data = await asyncio.to_thread(_gather, handle, ctx)
    return HTMLResponse(render(data), headers=HEADERS)
