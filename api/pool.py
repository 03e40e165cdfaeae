"""The API's own small thread pool for the file reads its requests make (logs, the journal, bundles).

`asyncio.to_thread` shares the loop's default executor with the supervisor loop (its /proc reads,
its captures, its state saves): eight `GET /logs` on a giant log once filled it and the loop stood
still for 300 s (issue 33). API reads wait here, behind each other, never in front of the loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

API_THREADS = 4


class ApiPool:
    """`await pool.run(fn, *args)`: `fn` on one of `threads` threads that only the API uses."""

    def __init__(self, threads: int = API_THREADS) -> None:
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._executor is None:  # made on first use: an app that never reads a file starts none
            self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="api-io")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
