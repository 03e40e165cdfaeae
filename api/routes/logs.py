"""`GET /logs`: the server's output as the log keeper wrote it, secrets redacted; `follow=true`
keeps the answer open and sends each new line (`sglang-supervisor logs -f`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from starlette.responses import Response, StreamingResponse

from api import logview
from api.deps import ApiContext, Context
from api.errors import error_response
from api.launchlog import NoPreviousLaunch, previous_launch
from api.streams import FOLLOW_POLL_S, FollowResponse, follow_chunks, joined, start_following, too_many_follows

MAX_LOG_LINES = 10_000

router = APIRouter(tags=["status"])


def render_line(line: bytes, redact: Callable[[str], str]) -> bytes:
    text = line.decode("utf-8", errors="replace")
    if "\r" in text:  # a progress bar's updates: its latest state
        text = [s for s in text.split("\r") if s.strip()][-1] if text.strip() else ""
    return (redact(text) + "\n").encode()


def rendered(lines: list[bytes], redact: Callable[[str], str]) -> list[bytes]:
    """`lines` as the answer sends them, in chunks; run on the API's pool, never on the loop (a
    redaction per line of a flood held the loop: api/streams.py)."""
    return joined(render_line(line, redact) for line in lines)


def rendered_tail(ctx: ApiContext, log_file: Path, n: int, keep: Callable[[bytes], bool]) -> list[bytes]:
    """The last `n` lines `keep` keeps, each launch's start marked (api/logview.py); bounded in bytes."""
    return rendered(logview.marked_tail(log_file, n, logview.launches(ctx.journal), keep), ctx.redact)


@router.get(
    "/logs",
    response_class=StreamingResponse,
    responses={200: {"description": "the server's output, one line each", "content": {"text/plain": {}}}},
)
async def logs(
    ctx: Context,
    lines: Annotated[int, Query(ge=0, le=MAX_LOG_LINES, description="how many of the last lines")] = 100,
    # Not in the schema: an OpenAPI client (or fuzzer) cannot consume an answer that never ends.
    follow: Annotated[bool, Query(include_in_schema=False)] = False,
    launch: Annotated[
        Literal["previous"] | None, Query(description="previous: the output of the launch before this one")
    ] = None,
    all_lines: Annotated[
        bool, Query(alias="all", description="also the access lines of the daemon's own health and metrics polls")
    ] = False,
) -> Response:
    """The server's output (stdout and stderr, as the log keeper wrote it), secrets redacted; the
    daemon's own polls of the server hidden unless `all=true`, each launch's start marked by a line
    `=== sglang-supervisor: launch of rung R, pid P, at T ===`."""
    keep = logview.probe_filter(ctx.probe_paths, all_lines)
    log_file = ctx.server_log
    if launch == "previous":
        if follow:
            return error_response(400, "bad_request", "a previous launch has ended: follow=true does not apply")
        try:
            prev = await ctx.pool.run(previous_launch, ctx.journal, log_file, lines)
        except NoPreviousLaunch as why:
            return error_response(404, "not_found", f"no previous launch to show: {why}")
        text = b"".join(await ctx.pool.run(rendered, [x for x in prev.lines if keep(x)], ctx.redact))
        about = f"rung={prev.rung}; pid={prev.pid}; launched={prev.at}"
        return Response(
            text,
            media_type="text/plain; charset=utf-8",
            headers={"X-Content-Type-Options": "nosniff", "X-Launch": about},
        )
    if follow and not ctx.follows.take():
        return too_many_follows(ctx.follows)
    try:
        follower = await start_following(log_file, ctx.pool) if follow else None
        # the journal read as it grows: a launch's separator as it happens
        launched = await start_following(ctx.journal.path, ctx.pool) if follow else None
        tail = await ctx.pool.run(rendered_tail, ctx, log_file, lines, keep)
    except BaseException:
        if follow:
            ctx.follows.give_back()
        raise

    async def body() -> AsyncIterator[bytes]:
        for chunk in tail:
            yield chunk
        if follower is not None and launched is not None:

            def render(new: list[bytes]) -> list[bytes]:
                marks = [x.separator() for x in logview.launches_in(launched.read_new())]
                return rendered([*marks, *(line for line in new if keep(line))], ctx.redact)

            try:
                async for chunk in follow_chunks(follower, render, FOLLOW_POLL_S, ctx.pool, ctx.follows):
                    yield chunk
            finally:
                launched.close()

    headers = {"X-Content-Type-Options": "nosniff"}
    if follow:
        return FollowResponse(ctx.follows, body(), media_type="text/plain; charset=utf-8", headers=headers)
    return StreamingResponse(body(), media_type="text/plain; charset=utf-8", headers=headers)
