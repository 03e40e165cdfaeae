"""Streamed reads, for `GET /logs` (the server's output, `follow=true` keeps the answer open) and the
follow mode of `GET /events` (JSON lines as the journal gets them), so `sglang-supervisor logs -f`
and `events --follow` are one open HTTP answer each, not a polling loop in the client.

The follower reads the file in a worker thread every `poll_s` (a tail -F on the server side); it
ends when the client goes away (Starlette cancels the generator) or the daemon shuts down.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated

from pydantic import StringConstraints, WithJsonSchema
from starlette.responses import JSONResponse, StreamingResponse

from api.follow import Follower
from supervisor.status.eventnames import EVENT_NAMES, unknown_events

FOLLOW_POLL_S = 0.25
NDJSON = "application/x-ndjson"

# A `?event=` filter: journal event names are snake_case (`state_changed`); anything else (`event=`,
# a number) is a mistake.
# The schema lists the names the daemon writes; the route answers any other well-formed name with a
# 422 naming them (`unknown_event_response`), which is clearer than the generic enum error.
EventNameQuery = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$"),
    WithJsonSchema({"type": "string", "enum": sorted(EVENT_NAMES)}),
]


def unknown_event_response(names: frozenset[str]) -> JSONResponse | None:
    """A 422 naming the unknown event names and listing the known ones; None when all are known."""
    bad = unknown_events(set(names))
    if not bad:
        return None
    plural = "s" if len(bad) > 1 else ""
    detail = f"unknown event name{plural} {', '.join(bad)}; known: {', '.join(sorted(EVENT_NAMES))}"
    body = {"error": "unknown_event", "detail": detail, "events": sorted(EVENT_NAMES)}
    return JSONResponse(body, status_code=422)


async def start_following(path: Path) -> Follower:
    """Open `path` at its end now, before the first lines are read, so nothing falls in between."""
    return await asyncio.to_thread(Follower, path)


async def follow_lines(follower: Follower, poll_s: float) -> AsyncIterator[bytes]:
    try:
        while True:
            lines = await asyncio.to_thread(follower.read_new)
            for line in lines:
                yield line
            if not lines:
                await asyncio.sleep(poll_s)
    finally:
        follower.close()


def follow_events(
    follower: Follower, first: list[dict[str, object]], match: Callable[[dict[str, object]], bool] | None, poll_s: float
) -> StreamingResponse:
    """The journal's matching records now, then each new one, one JSON object per line."""

    async def body() -> AsyncIterator[bytes]:
        # The follower was opened at the file's end before `first` was read: a record written in
        # between may be sent twice, never missed.
        stream = follow_lines(follower, poll_s)
        for record in first:
            yield (json.dumps(record, ensure_ascii=False) + "\n").encode()
        async for line in stream:
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict) and (match is None or match(record)):
                yield (json.dumps(record, ensure_ascii=False) + "\n").encode()

    return StreamingResponse(body(), media_type=NDJSON, headers={"Cache-Control": "no-store"})
