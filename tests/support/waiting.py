"""Waiting for a condition in tests: poll it until it holds or a deadline passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(cond: Callable[[], object], timeout: float) -> bool:
    """Poll `cond` until true; whether it became true within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return bool(cond())


def wait(pred: Callable[[], T], timeout: float, what: str) -> T:
    """The first truthy value `pred` returns; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def until(pred: Callable[[], Any], timeout: float, what: str) -> None:
    """`wait` for a test running on the event loop (the in-process daemon must keep running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
