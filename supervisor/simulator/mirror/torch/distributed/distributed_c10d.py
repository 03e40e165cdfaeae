"""torch.distributed's `broadcast` and `all_reduce` (`torch/distributed/distributed_c10d.py`) on a CPU
(gloo) group: SGLang's ranks > 0 call `broadcast` through `broadcast_pyobj` to learn rank 0's next
batch, and the start-up's memory profile all-reduces over the CPU group. Blocking waits on the wire."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

T_co = TypeVar("T_co", covariant=True)


class Source(Protocol[T_co]):
    def poll(self, timeout: float | None = ...) -> bool: ...

    def recv(self) -> T_co: ...


def broadcast(source: Source[T_co], timeout: float | None) -> T_co | None:
    """The source rank's next object; None when `timeout` passed first. Raises EOFError when it is gone."""
    if not source.poll(timeout):
        return None
    return source.recv()


def all_reduce(sources: Sequence[Source[object]], contributed: Callable[[object], bool]) -> None:
    """A CPU-group (gloo) all-reduce as seen from one rank: block on each peer until its share came.
    gloo notices a peer that closed its connection: EOFError here, an error in torch."""
    for source in sources:
        while not contributed(source.recv()):
            pass
