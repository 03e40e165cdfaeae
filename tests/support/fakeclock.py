"""A `supervisor.clock.Clock` for unit tests: time moves only when a test says so."""

from __future__ import annotations

import asyncio


class FakeClock:
    """A clock that only moves when told to; `sleep` advances it and yields to the loop."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self.now = start
        self._wall_offset = wall_offset

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + self._wall_offset

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def jump_wall(self, seconds: float) -> None:
        """The wall clock alone is set (an operator's `date -s`, NTP stepping): monotonic time holds."""
        self._wall_offset += seconds

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
        await asyncio.sleep(0)
