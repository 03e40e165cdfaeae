"""Injected time: the daemon reads the clock only through a `Clock`, so tests drive a fake one
(tests/support/fakeclock.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def iso(wall: float | None) -> str | None:
    """A wall-clock time as ISO 8601 in UTC with its offset (None stays None)."""
    if wall is None:
        return None
    return dt.datetime.fromtimestamp(wall, tz=dt.timezone.utc).isoformat(timespec="seconds")
