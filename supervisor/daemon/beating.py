"""The daemon's pulse: proof its loop cycles (systemd's WATCHDOG=1 goes out only from `Pulse.beat`),
and awaiting bounded blocking work (a stop, a capture, a sweep) while it still beats every second."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from supervisor.host.sdnotify import Notifier, WatchdogPacer

T = TypeVar("T")
Beat = Callable[[], None]


async def keep_beating(work: Awaitable[T], beat: Beat) -> T:
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=1.0)
        beat()
        if done:
            return task.result()


class Pulse:
    """The loop's heartbeat: its age answers `/livez`, and each beat paces WATCHDOG=1."""

    def __init__(self, notifier: Notifier, monotonic: Callable[[], float]) -> None:
        self.notifier = notifier
        self.monotonic = monotonic
        self.pacer = WatchdogPacer(notifier.watchdog_interval_s)
        self.at = monotonic()

    def beat(self) -> None:
        now = self.monotonic()
        self.at = now
        if self.pacer.due(now):
            self.notifier.watchdog()
            self.pacer.mark(now)

    def age(self) -> float:
        return self.monotonic() - self.at

    async def beating(self, work: Awaitable[T]) -> T:
        return await keep_beating(work, self.beat)
