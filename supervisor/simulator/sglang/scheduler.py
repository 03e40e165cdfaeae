"""A scheduler child (`sglang::scheduler_TPn`): start-up, then rank 0 serves and the others follow it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from multiprocessing.connection import Connection
from typing import NoReturn

from supervisor.simulator import hangs
from supervisor.simulator.collective import LeaderMesh
from supervisor.simulator.links import Done
from supervisor.simulator.loglines import LogWriter
from supervisor.simulator.messages import Ack, FiredUp, Step
from supervisor.simulator.mirror.torch.distributed.distributed_c10d import all_reduce
from supervisor.simulator.ncclwait import GlooError
from supervisor.simulator.onset import write_onset
from supervisor.simulator.options import Scenario
from supervisor.simulator.procutil import become_child, import_sglang, log_prefix, scheduler_title, start_heartbeat
from supervisor.simulator.rendezvous import RendezvousError
from supervisor.simulator.sglang import crashes
from supervisor.simulator.sglang.decode_loop import VERIFY_BROADCAST, ServingLoop
from supervisor.simulator.sglang.follower import Follower
from supervisor.simulator.sglang.segfault import die_of_segfault, victim_rank
from supervisor.simulator.sglang.shm import open_segment
from supervisor.simulator.sglang.startup import RankContext, Startup


def follow(ctx: RankContext, log: LogWriter, leader: Connection) -> NoReturn:
    """Ranks 1..n: take part in every forward rank 0 starts; nothing else to do, as in TP."""
    fault_at: float | None = None
    scenario = ctx.settings.scenario
    is_victim = scenario is Scenario.RANK_DIES and ctx.rank == victim_rank(ctx.args.tp_size)
    skips = scenario is Scenario.COLLECTIVE_SKIPPED
    skip_from: float | None = None  # COLLECTIVE_SKIPPED, the last rank: from then on it skips
    while True:
        timeout = None if fault_at is None else max(0.0, fault_at - time.monotonic())
        try:
            if leader.poll(timeout):
                message = leader.recv()
                if isinstance(message, Step) and message.kind == VERIFY_BROADCAST:
                    # SGLang #28815: rank 0 skipped this broadcast; the receivers wait in it for good
                    hangs.gpu_sleep(ctx.settings.gpu_file)
                if isinstance(message, Step):
                    if skip_from is not None and time.monotonic() >= skip_from:
                        _skip_the_collective(ctx)
                    else:
                        leader.send(Ack(ctx.rank))
                        if skips:  # the forward's all-reduce: wait for its result
                            all_reduce([leader], lambda m: isinstance(m, Done))
                elif isinstance(message, FiredUp) and is_victim:
                    fault_at = time.monotonic() + ctx.settings.fault_after_s
                elif isinstance(message, FiredUp) and skips and ctx.rank == ctx.args.tp_size - 1:
                    skip_from = time.monotonic() + ctx.settings.fault_after_s
        except (EOFError, OSError):
            hangs.wait_for_collective()  # rank 0 is gone; NCCL would not notice either
        if fault_at is not None and time.monotonic() >= fault_at:
            die_of_segfault(ctx, log)


def _skip_the_collective(ctx: RankContext) -> None:
    """SGLang #33289's shape: this rank decided, on its own view, that it had no batch to run, so it
    skips the forward and its all-reduce and goes back to its loop, idle; every other rank waits in
    the all-reduce for its share, for good. No error and no log line: only a collective that never
    completes, and a rank that is not in it, which SGLang's own watchdog never dumps."""
    s = ctx.settings
    write_onset(s.onset_file, s.scenario.value, s.requested.value, ctx.main_pid, ctx.args.unknown_flags)


def rendezvous_failed(ctx: RankContext, log: LogWriter, error: RendezvousError | GlooError) -> NoReturn:
    """SGLang's scheduler on an exception: log it, SIGQUIT the parent (which kills the tree), end."""
    if isinstance(error, GlooError):
        text = crashes.gloo_traceback(str(error))
    else:
        text = crashes.dist_init_traceback(str(error), store_side=ctx.rank == 0)
    log.error(text.rstrip("\n"))
    with contextlib.suppress(OSError):
        os.kill(os.getppid(), signal.SIGQUIT)
    os._exit(0)


def run_scheduler_process(
    ctx: RankContext,
    ready: Connection,
    inbox: Connection | None,
    outbox: Connection | None,
    peers: list[Connection],
) -> None:
    """Entry point of `sglang::scheduler[_TP{rank}]`; rank 0 gets the request and output pipes.

    As in SGLang, the child imports first (tens of seconds on a real host, no output, its command
    line still multiprocessing's spawn bootstrap) and only then names itself and logs.
    """
    modules = import_sglang(ctx.settings.import_seconds)
    tp = ctx.args.tp_size
    become_child(scheduler_title(ctx.rank, tp), ctx.settings.scenario is Scenario.IGNORE_SIGTERM)
    log = LogWriter(log_prefix(ctx.rank, tp))
    segment = open_segment(ctx.settings.shm_dir)  # noqa: F841 -- mapped for the process's life, as SGLang's
    start_heartbeat("ProcessGroupNCCL-watchdog")
    try:
        startup = Startup(ctx, log)
        try:
            weights = startup.run()
        except (RendezvousError, GlooError) as e:
            rendezvous_failed(ctx, log, e)
        ready.send(
            {
                "status": "ready",
                "max_total_num_tokens": ctx.facts.kv_tokens,
                "max_req_input_len": ctx.facts.context_len - 1,
            }
        )
        links = startup.links
        if ctx.rank == 0 and inbox is not None and outbox is not None:
            mesh = LeaderMesh(links, ctx.settings.gpu_file) if links else None
            ServingLoop(ctx, log, inbox, outbox, peers, mesh).run()
        elif links:
            Follower(ctx, log, links[0]).run()
        else:
            follow(ctx, log, peers[0])
        del weights, modules
    except KeyboardInterrupt:
        os._exit(1)

