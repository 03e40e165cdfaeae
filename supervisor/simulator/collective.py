"""Collectives across the nodes of a group, over the rendezvous links: every forward rank 0 runs
is an all-reduce with every other rank of every node.

Rank 0 sends the step, each rank answers with its share, rank 0 sends the result. A rank inside a
collective waits as NCCL makes it wait (ncclwait.py: a spin). This is rank 0's side, both engines';
the other ranks' side is each engine's own (sglang/follower.py, vllm/worker.py). A peer that died or
stopped is never noticed: there is no error, only a collective that never completes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from supervisor.simulator.links import Done, Peer
from supervisor.simulator.messages import Ack, FiredUp, Step
from supervisor.simulator.ncclwait import wait_for as _wait


class LeaderMesh:
    """Rank 0's side: one link to every other rank of the group, in rank order."""

    def __init__(self, links: Sequence[Peer], gpu: str | None) -> None:
        self.links = links
        self.gpu = gpu

    def _send_all(self, message: Step | Done | FiredUp) -> None:
        for link in self.links:
            with contextlib.suppress(OSError):  # a dead peer: the collective will wait for it
                link.send(message)

    def forward(self, kind: str) -> None:
        """One forward pass and its all-reduce; never returns while any rank of any node is gone or
        stopped. Its host thread ends up where SGLang's does, in the synchronize after the launch: the
        collective itself runs on the GPU, so no collective frame is on the Python stack."""
        self._send_all(Step(kind))
        _wait(self.links, Ack, self.gpu)
        self._send_all(Done())

    def fired_up(self) -> None:
        self._send_all(FiredUp())
