"""`GET /events`: the journal, filtered by event name and time; `follow=true` streams new records."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BeforeValidator

from api import streams
from api.deps import Context
from api.models import EventList
from api.responses import INVALID

router = APIRouter(tags=["status"])

_RFC3339 = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)")


def journal_time(text: str) -> datetime | None:
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))  # the journal writes UTC with "Z"
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


def rfc3339(value: object) -> object:
    """Only a full date-time with its offset: pydantic alone would also take `0.5` as a Unix time."""
    if not isinstance(value, str) or not _RFC3339.fullmatch(value.strip()):
        raise ValueError("expected an RFC 3339 time with an offset, e.g. 2026-11-30T12:00:00Z")
    return value.strip()


@router.get("/events", response_model=EventList, responses=INVALID)
async def events(
    ctx: Context,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    event: Annotated[
        list[streams.EventNameQuery] | None, Query(max_length=64, description="only these events (repeatable)")
    ] = None,
    since: Annotated[
        datetime | None,
        BeforeValidator(rfc3339),
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

    def match(record: dict[str, object]) -> bool:
        if names and record.get("event") not in names:
            return False
        if start is None:
            return True
        at = journal_time(str(record.get("ts", "")))
        return at is not None and at >= start

    if follow and not ctx.follows.take():
        return streams.too_many_follows(ctx.follows)
    try:
        follower = await streams.start_following(ctx.journal.path, ctx.pool) if follow else None
        found = await ctx.pool.run(ctx.journal.read, limit, match if names or start else None)
    except BaseException:
        if follow:
            ctx.follows.give_back()
        raise
    if follower is not None:
        return streams.follow_events(follower, found, match, streams.FOLLOW_POLL_S, ctx.pool, ctx.follows)
    return EventList(events=found)
