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
from collections.abc import Sequence

from supervisor.simulator.gpu.kernel import SpinningKernel, settle
from supervisor.simulator.links import Done, Link, Peer
from supervisor.simulator.messages import Ack, FiredUp
from supervisor.simulator.mirror.torch.cuda.streams import Event
from supervisor.simulator.mirror.torch.distributed.distributed_c10d import all_reduce

GPU_BUSY_AFTER_S = 1.0  # NVML averages utilisation over its sample period: a stuck kernel shows after it


class _Collective:
    """The all-reduce kernel: finished once the expected message came from every link."""

    def __init__(self, links: Sequence[Peer], expect: type, gpu: str | None) -> None:
        self.pending = list(links)
        self.expect = expect
        self.gpu = gpu
        self.started = time.monotonic()
        self.shown = False
        self.fired_up = False  # rank 0 said the server is up while this rank waited

    def _arrived(self, link: Peer) -> bool:
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
            if self.shown:
                settle(self.gpu)  # the kernel finished after all: the GPU reads what it read before
            return True
        if not self.shown and time.monotonic() - self.started > GPU_BUSY_AFTER_S:
            self.shown = True
            SpinningKernel(self.gpu)
        os.sched_yield()
        return False


def wait_for(links: Sequence[Peer], expect: type, gpu: str | None) -> bool:
    kernel = _Collective(links, expect, gpu)
    done = Event()
    done.record(kernel)
    done.synchronize()
    return kernel.fired_up


class GlooError(RuntimeError):
    """A CPU-group collective lost a peer: gloo raises where NCCL would wait."""


def barrier(links: list[Link], rank: int, gpu: str | None, cpu_group: bool = False) -> None:
    """A start-up collective: rank 0 collects everyone's share and answers; nobody leaves before all
    ranks arrived. On the GPU (a captured forward's all-reduce) ranks spin as in a serving forward;
    on the CPU group (the memory profile's all-reduce, gloo) they block idle, and a peer that closed
    its connection raises GlooError, as gloo does."""
    if not cpu_group:
        if rank == 0:
            wait_for(links, Ack, gpu)
            _send_all(links, Done())
        else:
            _send_all(links, Ack(rank))
            wait_for(links, Done, gpu)
        return
    try:
        if rank == 0:
            all_reduce(links, lambda m: isinstance(m, Ack))
            _send_all(links, Done())
        else:
            _send_all(links, Ack(rank))
            all_reduce(links, lambda m: isinstance(m, Done))
    except EOFError:
        host, port = links[0].peer()
        raise GlooError(
            f"[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [{host}]:{port}"
        ) from None


def _send_all(links: Sequence[Peer], message: Ack | Done) -> None:
    for link in links:
        with contextlib.suppress(OSError):
            link.send(message)
