"""Streamed reads, for `GET /logs` (the server's output, `follow=true` keeps the answer open) and the
follow mode of `GET /events` (JSON lines as the journal gets them), so `sglang-supervisor logs -f`
and `events --follow` are one open HTTP answer each, not a polling loop in the client.

The follower reads the file on the API's thread pool (api/pool.py) every `poll_s` (a tail -F on
the server side), at most api.follow.READ_BUDGET bytes a read, and sends them as the client takes
them: a client that stops reading holds nothing more than its connection's write buffer until the
write deadline (supervisor/host/apiguard.py) closes it. It ends when the client goes away
(Starlette cancels the generator) or the daemon shuts down. At most MAX_FOLLOWS streams are open
at once (`FollowSlots`); one more is answered 503 at once (260 open streams locked /livez out).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated

from pydantic import StringConstraints, WithJsonSchema
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from api.follow import NOTE, Follower
from api.pool import ApiPool
from supervisor.status.eventnames import EVENT_NAMES, unknown_events

FOLLOW_POLL_S = 0.25
MAX_FOLLOWS = 64
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


class FollowSlots:
    """How many follow streams are open; `take` refuses beyond `limit`."""

    def __init__(self, limit: int = MAX_FOLLOWS) -> None:
        self.limit = limit
        self.open = 0
        self.refused = 0

    def take(self) -> bool:
        if self.open >= self.limit:
            self.refused += 1
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        self.open = max(0, self.open - 1)


def too_many_follows(slots: FollowSlots) -> JSONResponse:
    detail = f"{slots.open} follow streams are open (the limit is {slots.limit}); close one and retry"
    return JSONResponse({"error": "too_many_follows", "detail": detail}, status_code=503, headers={"Retry-After": "5"})


class FollowResponse(StreamingResponse):
    """A streamed answer holding a follow slot, given back however the answer ends."""

    def __init__(self, slots: FollowSlots, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slots.give_back()


async def start_following(path: Path, pool: ApiPool) -> Follower:
    """Open `path` at its end now, before the first lines are read, so nothing falls in between."""
    return await pool.run(Follower, path)


async def follow_lines(follower: Follower, poll_s: float, pool: ApiPool) -> AsyncIterator[bytes]:
    try:
        while True:
            lines = await pool.run(follower.read_new)
            for line in lines:
                yield line
            if not lines:
                await asyncio.sleep(poll_s)
    finally:
        follower.close()


def follow_events(
    follower: Follower,
    first: list[dict[str, object]],
    match: Callable[[dict[str, object]], bool] | None,
    poll_s: float,
    pool: ApiPool,
    slots: FollowSlots,
) -> StreamingResponse:
    """The journal's matching records now, then each new one, one JSON object per line."""

    async def body() -> AsyncIterator[bytes]:
        # The follower was opened at the file's end before `first` was read: a record written in
        # between may be sent twice, never missed.
        stream = follow_lines(follower, poll_s, pool)
        for record in first:
            yield (json.dumps(record, ensure_ascii=False) + "\n").encode()
        skipped = 0
        async for line in stream:
            if line.startswith(NOTE) and follower.skipped != skipped:  # this reader fell behind: how much
                note = {"skipped_bytes": follower.skipped - skipped, "detail": line.decode(errors="replace")}
                yield (json.dumps(note) + "\n").encode()
                skipped = follower.skipped
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict) and (match is None or match(record)):
                yield (json.dumps(record, ensure_ascii=False) + "\n").encode()

    return FollowResponse(slots, body(), media_type=NDJSON, headers={"Cache-Control": "no-store"})
