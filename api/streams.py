"""Streamed reads, for `GET /logs` (the server's output, `follow=true` keeps the answer open) and the
follow mode of `GET /events` (JSON lines as the journal gets them), so `sglang-supervisor logs -f`
and `events --follow` are one open HTTP answer each, not a polling loop in the client.

The follower reads the file on the API's thread pool (api/pool.py) every `poll_s` (a tail -F on
the server side), at most api.follow.READ_BUDGET bytes a read, makes the answer's bytes of what it
read on that pool too (redaction, JSON: `render`), and sends them in pieces of about CHUNK bytes as
the client takes them: a client that stops reading holds nothing more than one read and its
connection's write buffer until the write deadline (supervisor/host/apiguard.py) closes it. It ends
when the client goes away (Starlette cancels the generator) or the daemon shuts down.

The loop only sends. Rendered on the loop line by line, one 1 MiB read was 8,000 redactions and
8,000 writes in a single turn of the loop (a write does not yield while the kernel takes it, nor
once the peer is gone): 20 followers of a 200 MB flood on a loaded 2-core machine kept /livez
unanswered for over 90 s, most of it after their clients had left. At most MAX_FOLLOWS streams are open
at once (`FollowSlots`); one more is answered 503 at once (260 open streams locked /livez out).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
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
CHUNK = 64 * 1024  # a streamed answer's lines are sent joined in pieces of about this size
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
        # Set when the daemon stops: each follow ends its answer within a poll, so uvicorn's graceful
        # shutdown finds no stream to cancel (a cancelled one logged three error lines, issue 53).
        self.closing = False

    def close(self) -> None:
        self.closing = True

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


def joined(pieces: Iterable[bytes], size: int = CHUNK) -> list[bytes]:
    """`pieces` (rendered lines) joined into chunks of about `size` bytes, each piece whole: one write
    of the loop per chunk instead of one per line."""
    out: list[bytes] = []
    held: list[bytes] = []
    n = 0
    for piece in pieces:
        held.append(piece)
        n += len(piece)
        if n >= size:
            out.append(b"".join(held))
            held, n = [], 0
    if held:
        out.append(b"".join(held))
    return out


async def follow_chunks(
    follower: Follower,
    render: Callable[[list[bytes]], list[bytes]],
    poll_s: float,
    pool: ApiPool,
    slots: FollowSlots | None = None,
) -> AsyncGenerator[bytes, None]:
    """What `follower` reads, made into the answer's chunks by `render`, both on the API's pool: the
    loop only sends the chunks. Ends (after what is already written) once `slots` is closing."""

    def step() -> tuple[bool, list[bytes]]:
        lines = follower.read_new()
        return bool(lines), render(lines)

    try:
        while True:
            closing = slots is not None and slots.closing
            read_any, chunks = await pool.run(step)
            for chunk in chunks:
                yield chunk
            if closing:
                return
            if not read_any:
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

    skipped = 0

    def render(lines: list[bytes]) -> list[bytes]:
        nonlocal skipped
        out: list[bytes] = []
        for line in lines:
            if line.startswith(NOTE) and follower.skipped != skipped:  # this reader fell behind: how much
                note = {"skipped_bytes": follower.skipped - skipped, "detail": line.decode(errors="replace")}
                out.append((json.dumps(note) + "\n").encode())
                skipped = follower.skipped
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict) and (match is None or match(record)):
                out.append((json.dumps(record, ensure_ascii=False) + "\n").encode())
        return joined(out)

    async def body() -> AsyncIterator[bytes]:
        # The follower was opened at the file's end before `first` was read: a record written in
        # between may be sent twice, never missed.
        stream = follow_chunks(follower, render, poll_s, pool, slots)
        for chunk in joined((json.dumps(record, ensure_ascii=False) + "\n").encode() for record in first):
            yield chunk
        async for chunk in stream:
            yield chunk

    return FollowResponse(slots, body(), media_type=NDJSON, headers={"Cache-Control": "no-store"})
