"""`WorkerProc.worker_busy_loop` (vLLM 0.26.0 `vllm/v1/executor/multiproc_executor.py:988`): a worker waits
for the next broadcast from the engine core, runs it, and answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn


class WorkerProc:
    def __init__(self, dequeue: Callable[[], object], handle: Callable[[object], None]) -> None:
        self._dequeue = dequeue
        self._handle = handle

    def worker_busy_loop(self) -> NoReturn:
        while True:
            self._handle(self._dequeue())
