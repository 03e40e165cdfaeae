"""Times and durations as a person reads them (issue 53), for the page and the CLI (pure: the zone
and "now" are arguments; no clock read here).

One format for a moment: ISO 8601 to the second with its offset, in the host's local zone (or UTC
when asked: `--utc`), e.g. `2026-12-07T12:16:51-05:00`. The daemon's records keep UTC
(`...+00:00`, `...Z`); only what is shown to a person is converted. A duration: `850 ms`, `12.0 s`,
`3 min 10 s`, `2 h 5 min`, `3 d 4 h`.
"""

from __future__ import annotations

from datetime import datetime, timezone, tzinfo

UTC = timezone.utc


def parse(value: object) -> datetime | None:
    """An ISO 8601 time as the daemon writes it (offset or `Z`); a naive one is taken as UTC."""
    if not isinstance(value, str) or not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def when(value: object, *, utc: bool = False, zone: tzinfo | None = None) -> str:
    """`value` in the one format, in `zone` (None: the host's local zone) or UTC; what cannot be
    read as a time is returned as it is."""
    t = parse(value)
    if t is None:
        return "-" if value in (None, "") else str(value)
    shown = t.astimezone(UTC) if utc else t.astimezone(zone)
    return shown.isoformat(timespec="seconds")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 0:
        seconds = 0.0
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def ago(value: object, now: float) -> str:
    """How long before `now` (epoch seconds) `value` was: `2 min 5 s ago`; `in 3.0 s` for a future
    time; empty when `value` is not a time."""
    t = parse(value)
    if t is None:
        return ""
    dt = now - t.timestamp()
    if dt < 0:
        return f"in {duration(-dt)}"
    return f"{duration(dt)} ago"
