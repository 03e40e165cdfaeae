"""Waiting for a condition in tests: the forms the tests use of the product's one polling loop
(supervisor.common.waiting), for a condition that is a plain callable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from supervisor.common.waiting import WaitTimeout, wait_for_async
from supervisor.common.waiting import wait_for as _wait_for

T = TypeVar("T")


def wait_for(cond: Callable[[], object], timeout: float, interval: float = 0.1) -> bool:
    """Poll `cond` until true; whether it became true within `timeout`."""
    try:
        _wait_for(lambda: True if cond() else None, timeout=timeout, interval=interval)
    except WaitTimeout:
        return False
    return True


def wait(pred: Callable[[], T], timeout: float, what: str) -> T:
    """The first truthy value `pred` returns; WaitTimeout naming `what` after `timeout`."""
    return _wait_for(lambda: pred() or None, timeout=timeout, what=what)


async def until(pred: Callable[[], Any], timeout: float, what: str) -> None:
    """`wait` for a test running on the event loop (the in-process daemon must keep running)."""
    await wait_for_async(lambda: True if pred() else None, timeout=timeout, what=what)
