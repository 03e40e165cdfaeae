"""A monotonic total fed by a reading that may start again at 0 (a counter in a file that each new
writer recreates): what /status shows and what the Prometheus counter is fed from, one source."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RestartingCount:
    total: int = 0
    seen: int = 0  # the reading at the last call

    def feed(self, reading: int) -> int:
        """The total after `reading`: growth counts; a drop is a fresh counter, all of it new."""
        self.total += reading - self.seen if reading >= self.seen else reading
        self.seen = reading
        return self.total
