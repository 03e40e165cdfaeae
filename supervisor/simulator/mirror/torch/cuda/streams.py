"""torch.cuda.Event's host side: `synchronize` blocks the calling thread until the GPU passes the event.

CUDA's default (no blocking-sync flag) is a spin-wait in the driver at one core: that is what real
SGLang's scheduler did on the H200 when a kernel never finished (REAL_SGLANG.md).
"""

from __future__ import annotations

from typing import Protocol


class Kernel(Protocol):
    @property
    def finished(self) -> bool: ...


class Event:
    def __init__(self) -> None:
        self._kernel: Kernel | None = None

    def record(self, kernel: Kernel) -> None:
        self._kernel = kernel

    def query(self) -> bool:
        return self._kernel is None or self._kernel.finished

    def synchronize(self) -> None:
        kernel = self._kernel
        while kernel is not None and not kernel.finished:  # the driver's spin-wait
            pass
