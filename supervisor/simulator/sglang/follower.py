"""A rank other than 0, on any node, of the simulated SGLang server: between forwards it waits for
rank 0's next step in `broadcast` (SGLang's `broadcast_pyobj`), answers every forward over the
rendezvous links (rank 0's side is `supervisor.simulator.collective.LeaderMesh`), and runs this
node's faults. A peer that died or stopped is never noticed: only a collective that never completes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import NoReturn

from supervisor.simulator import hangs
from supervisor.simulator.gpu.kernel import SpinningKernel
from supervisor.simulator.links import Done, Link
from supervisor.simulator.loglines import LogWriter
from supervisor.simulator.messages import Ack, FiredUp, Step
from supervisor.simulator.mirror.torch.cuda.streams import Event
from supervisor.simulator.mirror.torch.distributed.distributed_c10d import broadcast
from supervisor.simulator.ncclwait import wait_for as _wait
from supervisor.simulator.nodes import node_layout
from supervisor.simulator.onset import write_onset
from supervisor.simulator.options import Scenario
from supervisor.simulator.sglang import crashes
from supervisor.simulator.sglang.schedwatchdog import start_watchdog
from supervisor.simulator.sglang.segfault import die_of_segfault
from supervisor.simulator.sglang.startup import RankContext


class Follower:
    """A rank other than 0, on any node: answer every forward, and run this node's faults."""

    def __init__(self, ctx: RankContext, log: LogWriter, leader: Link) -> None:
        self.ctx = ctx
        self.log = log
        self.leader = leader
        self.layout = node_layout(ctx.args)
        self.fault_at: float | None = None
        self.stalled = False
        self.forward_since: float | None = None  # the forward in progress, for SGLang's watchdog

    def _my_fault(self) -> Scenario | None:
        scenario = self.ctx.settings.scenario
        if scenario is Scenario.RANK_DIES and self.ctx.rank == self.layout.victim():
            return scenario
        # Rank 0's faults, on a node without rank 0: its first rank has them.
        node_faults = (Scenario.CRASH_AFTER_READY, Scenario.HEALTH_HANGS, Scenario.SERVING_STALL)
        if scenario in node_faults and self.layout.node_rank > 0 and self.ctx.rank == self.layout.first_local:
            return scenario
        return None

    def _armed(self) -> None:
        if self._my_fault() is not None and self.fault_at is None:
            self.fault_at = time.monotonic() + self.ctx.settings.fault_after_s

    def run(self) -> NoReturn:
        start_watchdog(self.ctx.args.watchdog_timeout, lambda: self.forward_since, self.log, self.ctx.main_pid)
        while True:
            timeout = None if self.fault_at is None else max(0.0, self.fault_at - time.monotonic())
            try:
                message = broadcast(self.leader, timeout)
            except EOFError:
                hangs.wait_for_collective()  # rank 0 is gone: the next broadcast never comes
            if isinstance(message, Step):
                self._forward(message)
            elif isinstance(message, FiredUp):
                self._armed()
            if self.fault_at is not None and time.monotonic() >= self.fault_at:
                self.fault_at = None
                self._begin_fault()

    def _forward(self, step: Step) -> None:
        gpu = self.ctx.settings.gpu_file
        self.forward_since = time.monotonic()
        if self.stalled and step.kind == "decode":
            _wait_forever(gpu)  # the decode forward's kernel never finishes; nobody gets this rank's share
        with contextlib.suppress(OSError):
            self.leader.send(Ack(self.ctx.rank))
        fired_up = _wait([self.leader], Done, gpu)
        self.forward_since = None
        if fired_up:
            self._armed()

    def _onset(self) -> None:
        s = self.ctx.settings
        write_onset(s.onset_file, s.scenario.value, s.requested.value, self.ctx.main_pid, self.ctx.args.unknown_flags)

    def _begin_fault(self) -> None:
        scenario = self._my_fault()
        if scenario is Scenario.RANK_DIES:
            die_of_segfault(self.ctx, self.log)
        elif scenario is Scenario.CRASH_AFTER_READY:
            self._onset()
            self.log.error(crashes.forward_crash_traceback().rstrip("\n"))
            with contextlib.suppress(OSError):
                os.kill(self.ctx.main_pid, signal.SIGQUIT)  # as SGLang's scheduler tells its parent
            os._exit(0)
        elif scenario is Scenario.HEALTH_HANGS:
            self._onset()
            hangs.wait_for_collective()
        elif scenario is Scenario.SERVING_STALL:
            self._onset()
            self.stalled = True


def _wait_forever(gpu: str | None) -> NoReturn:
    """A forward whose kernel never finishes: the thread spins in Event.synchronize for good."""
    done = Event()
    done.record(SpinningKernel(gpu))
    done.synchronize()
    raise AssertionError("a never-ending kernel finished")
