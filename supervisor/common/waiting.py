"""Waiting until what a daemon shows matches: its `GET /status`, its in-process snapshot, a file.

One polling loop for every caller that waits on a daemon: the CLI's `--wait`, the in-process face
(`supervisor.root.inprocess`), the benchmarks and the tests. A caller gives a `read` that answers
the current value, None while there is nothing to read (the daemon is unreachable or restarting;
not a failure), or raises to give up at once (the daemon exited); and a `pred` the value must meet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """`what` did not happen within the timeout; `last` is the last value read (None: none was)."""

    def __init__(self, message: str, last: object) -> None:
        super().__init__(message)
        self.last = last


def _message(what: str, timeout: float, last: T | None, show: Callable[[T], str]) -> str:
    seen = "nothing read" if last is None else show(last)
    return f"no {what} within {timeout:.0f} s; last {seen}"


def _shown(value: object) -> str:
    return str(value)[:1500]


def _any(_: object) -> bool:
    return True


def wait_for(
    read: Callable[[], T | None],
    pred: Callable[[T], bool] = _any,
    timeout: float = 10.0,
    *,
    what: str = "match",
    interval: float = 0.1,
    show: Callable[[T], str] = _shown,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """The first value `read` answers that `pred` holds for, polled every `interval` s; once more
    after the deadline, then `WaitTimeout` naming `what` and the last value (through `show`)."""
    deadline = clock() + timeout
    last: T | None = None
    while True:
        value = read()
        if value is not None:
            last = value
            if pred(value):
                return value
        if clock() >= deadline:
            raise WaitTimeout(_message(what, timeout, last, show), last)
        sleep(interval)


async def wait_for_async(
    read: Callable[[], T | None],
    pred: Callable[[T], bool] = _any,
    timeout: float = 10.0,
    *,
    what: str = "match",
    interval: float = 0.1,
    show: Callable[[T], str] = _shown,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`wait_for` for a caller on the event loop: it sleeps with `asyncio.sleep`, so the loop (and an
    in-process daemon on it) runs on while it waits."""
    deadline = clock() + timeout
    last: T | None = None
    while True:
        value = read()
        if value is not None:
            last = value
            if pred(value):
                return value
        if clock() >= deadline:
            raise WaitTimeout(_message(what, timeout, last, show), last)
        await asyncio.sleep(interval)
