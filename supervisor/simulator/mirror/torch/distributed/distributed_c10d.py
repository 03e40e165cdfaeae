"""torch.distributed's `broadcast` (`torch/distributed/distributed_c10d.py`), as SGLang's ranks > 0
call it through `broadcast_pyobj` to learn rank 0's next batch: a blocking wait on the wire."""

from __future__ import annotations

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
