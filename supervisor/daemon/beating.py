"""Awaiting bounded blocking work (a stop, a capture, a sweep) while the daemon still proves its
loop cycles: `beat` (the owner's heartbeat, which paces systemd's WATCHDOG=1) runs every second."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
Beat = Callable[[], None]


async def keep_beating(work: Awaitable[T], beat: Beat) -> T:
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=1.0)
        beat()
        if done:
            return task.result()
