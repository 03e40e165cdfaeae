"""How a rank waits inside a collective of a multi-node group, as NCCL makes it wait.

REAL_SGLANG.md (the TP harness on two H200s): the waiting ranks spin at 100 % GPU while their host
thread spins in the synchronize. Here the thread spins in `Event.synchronize` on a "kernel" that
finishes once every peer's message has arrived over the wire (a driver spin-wait that yields the
core when others want it, as CUDA's default scheduling does when cores are short), and after a
second the fake GPU, when there is one, reads 100 % busy. A dead or stopped peer is never noticed.
"""

from __future__ import annotations

import contextlib
import os
import time

from supervisor.simulator.fakegpu import SpinningKernel
from supervisor.simulator.links import Done, Link
from supervisor.simulator.messages import Ack, FiredUp
from supervisor.simulator.mirror.torch.cuda.streams import Event

GPU_BUSY_AFTER_S = 1.0  # NVML averages utilisation over its sample period: a stuck kernel shows after it


class _Collective:
    """The all-reduce kernel: finished once the expected message came from every link."""

    def __init__(self, links: list[Link], expect: type, gpu: str | None) -> None:
        self.pending = list(links)
        self.expect = expect
        self.gpu = gpu
        self.started = time.monotonic()
        self.shown = False
        self.fired_up = False  # rank 0 said the server is up while this rank waited

    def _arrived(self, link: Link) -> bool:
        try:
            while link.poll(0):
                message = link.recv()
                if isinstance(message, self.expect):
                    return True
                self.fired_up |= isinstance(message, FiredUp)
        except EOFError:
            pass  # a dead peer never contributes; NCCL does not notice either
        return False

    @property
    def finished(self) -> bool:
        self.pending = [link for link in self.pending if not self._arrived(link)]
        if not self.pending:
            return True
        if not self.shown and time.monotonic() - self.started > GPU_BUSY_AFTER_S:
            self.shown = True
            SpinningKernel(self.gpu)
        os.sched_yield()
        return False


def wait_for(links: list[Link], expect: type, gpu: str | None) -> bool:
    kernel = _Collective(links, expect, gpu)
    done = Event()
    done.record(kernel)
    done.synchronize()
    return kernel.fired_up


def barrier(links: list[Link], rank: int, gpu: str | None) -> None:
    """A start-up collective (the memory profile's all-reduce, a graph capture's first forward):
    rank 0 collects everyone's share and answers; nobody leaves before all ranks arrived."""
    if rank == 0:
        wait_for(links, Ack, gpu)
        for link in links:
            with contextlib.suppress(OSError):
                link.send(Done())
        return
    with contextlib.suppress(OSError):
        links[0].send(Ack(rank))
    wait_for(links, Done, gpu)
