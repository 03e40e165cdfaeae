"""torch's `tcp://` rendezvous (`torch/distributed/rendezvous.py`): global rank 0 hosts the TCPStore,
every other rank connects to it, and init waits until the whole world has joined."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _create_c10d_store(make_store: Callable[[], T]) -> T:
    """Build the store (the server on rank 0, a client elsewhere) and wait for the group: may take
    until the process group's timeout, with nothing printed meanwhile."""
    return make_store()
