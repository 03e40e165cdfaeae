"""Spawning the children as SGLang's engine does (multiprocessing "spawn"), and killing them as it does.

Children stay in the main process's process group and session; each sets PDEATHSIG itself.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import psutil

from supervisor.simulator.loglines import LogWriter
from supervisor.simulator.sglang.detokenizer import run_detokenizer_process
from supervisor.simulator.sglang.scheduler import run_scheduler_process
from supervisor.simulator.sglang.startup import RankContext


@dataclass
class Children:
    schedulers: list[BaseProcess]
    detokenizer: BaseProcess
    ready: list[Connection]  # one reader per rank, in rank order
    to_scheduler: Connection  # main -> rank 0
    from_detokenizer: Connection  # detokenizer -> main
    exit_status: dict[int, int] = field(default_factory=dict)  # pid -> raw wait status, from SIGCHLD

    def scheduler_alive(self, rank: int = 0) -> bool:
        pid = self.schedulers[rank].pid
        if pid is None or pid in self.exit_status:
            return False
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


def launch(contexts: list[RankContext], ignore_sigterm: bool, import_s: float, multinode: bool = False) -> Children:
    """Start every scheduler, then the detokenizer; main keeps only its own ends of the pipes.

    Multi-node, the ranks find each other at the rendezvous instead of over pipes."""
    mp = multiprocessing.get_context("spawn")
    to_sched_r, to_sched_w = mp.Pipe(duplex=False)
    to_detok_r, to_detok_w = mp.Pipe(duplex=False)
    to_main_r, to_main_w = mp.Pipe(duplex=False)
    peer_pairs = [] if multinode else [mp.Pipe(duplex=True) for _ in contexts[1:]]
    ready_readers: list[Connection] = []
    schedulers: list[BaseProcess] = []
    child_ends: list[Connection] = [to_sched_r, to_detok_w, to_detok_r, to_main_w]
    for ctx in contexts:
        ready_r, ready_w = mp.Pipe(duplex=False)
        ready_readers.append(ready_r)
        child_ends.append(ready_w)
        if ctx.rank == 0:
            peers = [leader_end for leader_end, _ in peer_pairs]
            target_args: tuple[object, ...] = (ctx, ready_w, to_sched_r, to_detok_w, peers)
        else:
            target_args = (ctx, ready_w, None, None, [peer_pairs[ctx.rank - 1][1]] if peer_pairs else [])
        proc = mp.Process(target=run_scheduler_process, args=target_args, name=f"scheduler_TP{ctx.rank}")
        proc.start()
        schedulers.append(proc)
    detok = mp.Process(
        target=run_detokenizer_process,
        args=(ignore_sigterm, to_detok_r, to_main_w, import_s, contexts[0]),
        name="detokenizer",
    )
    detok.start()
    for pair in peer_pairs:
        child_ends.extend(pair)
    for conn in child_ends:
        conn.close()
    return Children(schedulers, detok, ready_readers, to_sched_w, to_main_r)


def launch_ranks(contexts: list[RankContext]) -> tuple[list[BaseProcess], list[Connection]]:
    """A node >= 1: its schedulers only (no tokenizer, no detokenizer), and their ready pipes."""
    mp = multiprocessing.get_context("spawn")
    schedulers: list[BaseProcess] = []
    readers: list[Connection] = []
    for ctx in contexts:
        ready_r, ready_w = mp.Pipe(duplex=False)
        proc = mp.Process(
            target=run_scheduler_process, args=(ctx, ready_w, None, None, []), name=f"scheduler_TP{ctx.rank}"
        )
        proc.start()
        ready_w.close()
        schedulers.append(proc)
        readers.append(ready_r)
    return schedulers, readers


def kill_process_tree(include_parent: bool, log: LogWriter | None = None) -> None:
    """SGLang's kill_process_tree: SIGKILL every descendant, then (optionally) this process."""
    if log is not None:  # 0.5.16 logs every call (utils/common.py)
        pid = os.getpid()
        log.info(f"kill_process_tree called: parent_pid={pid}, include_parent={include_parent}, pid={pid}")
    with contextlib.suppress(ValueError):  # only the main thread may; SGLang's handler is gone there too
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # as SGLang: no log line per killed child
    try:
        descendants = psutil.Process().children(recursive=True)
    except psutil.Error:
        descendants = []
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.kill()
    if include_parent:
        os.kill(os.getpid(), signal.SIGKILL)
