"""Refused logins cost the attacker, not the journal (issue 50).

475,701 wrong `POST /ui/login` in 407 s (415-1,150 a second, nothing in the way) each wrote a
journal record and rotated the incident and launch records out. Now each client address has a
bucket of tries (BURST, refilled PER_MINUTE a minute), and all addresses together a larger one
(TOTAL_BURST, TOTAL_PER_MINUTE): a login tried on an empty bucket is refused without the token
being compared (HTTP 429 with Retry-After), so guessing runs at the refill rate at most. And
refusals are journalled once per address per INTERVAL_S: the first refusal after a quiet interval
writes a record at once, with `count` the refusals it stands for (those held since the address's
previous record, and this one) and `throttled` how many of them the bucket refused unchecked.

Pure state with an injected clock; the route (api/page.py) does the I/O. At most MAX_ADDRESSES are
tracked, the least recently seen forgotten first, so a flood from many addresses cannot grow it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

BURST = 10
PER_MINUTE = 10.0
TOTAL_BURST = 60
TOTAL_PER_MINUTE = 60.0
INTERVAL_S = 60.0
MAX_ADDRESSES = 4096


@dataclass(frozen=True)
class Refusal:
    """A journal record due: `count` refusals from `client`, `throttled` of them unchecked."""

    client: str
    count: int
    throttled: int


@dataclass
class _Bucket:
    tokens: float
    at: float

    def take(self, now: float, burst: int, per_s: float) -> float:
        """Take one try: 0.0 when there was one, else the seconds until there is."""
        self.tokens = min(float(burst), self.tokens + max(0.0, now - self.at) * per_s)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / per_s


@dataclass
class _Address:
    bucket: _Bucket
    held: int = 0  # refusals not yet journalled
    held_throttled: int = 0
    last_record: float | None = None


class LoginGuard:
    def __init__(
        self,
        *,
        burst: int = BURST,
        per_minute: float = PER_MINUTE,
        total_burst: int = TOTAL_BURST,
        total_per_minute: float = TOTAL_PER_MINUTE,
        interval_s: float = INTERVAL_S,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst, self._per_s = burst, per_minute / 60.0
        self._total_burst, self._total_per_s = total_burst, total_per_minute / 60.0
        self._interval_s = interval_s
        self._max = max_addresses
        self._clock = clock
        self._total = _Bucket(float(total_burst), clock())
        self._addresses: OrderedDict[str, _Address] = OrderedDict()
        self.throttled = 0  # tries refused unchecked, ever

    def admit(self, client: str) -> float:
        """0.0: compare the offered token; else the seconds to wait (the try is refused unchecked)."""
        now = self._clock()
        entry = self._entry(client, now)
        wait = entry.bucket.take(now, self._burst, self._per_s)
        if wait == 0.0:
            wait = self._total.take(now, self._total_burst, self._total_per_s)
            if wait > 0.0:
                entry.bucket.tokens += 1.0  # not this address's fault: its try is given back
        if wait > 0.0:
            self.throttled += 1
        return wait

    def refused(self, client: str, *, throttled: bool) -> Refusal | None:
        """Count one refusal from `client`; the record to journal when one is due."""
        now = self._clock()
        entry = self._entry(client, now)
        entry.held += 1
        entry.held_throttled += int(throttled)
        if entry.last_record is not None and 0.0 <= now - entry.last_record < self._interval_s:
            return None
        return self._take(client, entry, now)

    def flush(self, client: str) -> Refusal | None:
        """The refusals held for `client` (after a good login, say), or None."""
        entry = self._addresses.get(client)
        if entry is None or entry.held == 0:
            return None
        return self._take(client, entry, self._clock())

    def _take(self, client: str, entry: _Address, now: float) -> Refusal:
        record = Refusal(client, entry.held, entry.held_throttled)
        entry.held = entry.held_throttled = 0
        entry.last_record = now
        return record

    def _entry(self, client: str, now: float) -> _Address:
        entry = self._addresses.get(client)
        if entry is None:
            entry = _Address(_Bucket(float(self._burst), now))
            self._addresses[client] = entry
            while len(self._addresses) > self._max:
                self._addresses.popitem(last=False)
        else:
            self._addresses.move_to_end(client)
        return entry
