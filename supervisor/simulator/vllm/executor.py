"""The engine core's executor: the uniproc executor (world size 1: the engine core is the worker) or the
multiproc executor (a `VLLM::Worker_*` process per local rank), vLLM 0.26.0's v1/executor/.

What the engine core sees of it: `start` (workers built and loaded, READY), `rpc` (a start-up
broadcast every rank runs), `execute` (one forward; only the output rank answers), `serving`, and
`shutdown`. Failures reach the engine core as `Fatal`, carrying the traceback vLLM would log.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from supervisor.simulator.messages import Ack, FiredUp, Step
from supervisor.simulator.vllm import crashes, lines
from supervisor.simulator.vllm.context import VllmContext
from supervisor.simulator.vllm.log import VllmLog
from supervisor.simulator.vllm.messages import WorkerError
from supervisor.simulator.vllm.worker import OomDuringLoad, WorkerRuntime, run_worker_process, worker_exception

SIGTERM_GRACE_S = 4.0  # multiproc_executor.py:448 `wait_for_termination(active_procs(), 4)`


class Fatal(Exception):
    """The engine core cannot go on: `text` is logger.exception's traceback, `bootstrap` multiprocessing's."""

    def __init__(self, text: str, bootstrap: str) -> None:
        super().__init__(text)
        self.text = text
        self.bootstrap = bootstrap


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class UniExecutor:
    """uniproc_executor.py: the driver worker lives in the engine core process."""

    def __init__(self, ctx: VllmContext, log: VllmLog) -> None:
        self.runtime = WorkerRuntime(ctx, 0, 0, log)
        self.runtime.in_worker = False
        self.ctx = ctx
        self.failed = threading.Event()

    def start(self, on_failure: Callable[[], None]) -> None:
        self.runtime.init_device(_free_port())
        try:
            self.runtime.load_model()
        except OomDuringLoad as e:
            facts = self.ctx.facts
            raise Fatal(str(e), crashes.load_oom_bootstrap(facts.v2_runner, facts.llama, 0, os.getpid())) from e

    def rpc(self, kind: str) -> None:
        if kind == "profile":
            self.runtime.profile()
        else:
            self.runtime.capture()

    def execute(self, kind: str) -> None:
        if self.runtime.forward(kind) is not None:  # the CUDA error surfaces in the engine core's own step
            text = worker_exception()
            raise Fatal(text, text)

    def serving(self) -> None:
        self.runtime.arm()

    def wake_s(self) -> float | None:
        """When the engine core must wake even with nothing to do: its own rank's fault is due."""
        return self.runtime.wait_s()

    def tick(self) -> None:
        if self.runtime.due() and self.runtime.wait_s() is not None:
            self.runtime.die()  # RANK_DIES at world size 1: the engine core itself

    def shutdown(self) -> None:
        pass


class MultiprocExecutor:
    """multiproc_executor.py:102-495: workers, their READY pipes, a death pipe each, and a monitor thread."""

    def __init__(self, ctx: VllmContext, log: VllmLog) -> None:
        self.ctx = ctx
        self.log = log
        self.procs: list[BaseProcess] = []
        self.death_writers: list[Connection] = []
        self.ready: list[Connection] = []
        self.rpc_conn: Connection | None = None
        self.failed = threading.Event()
        self.shutting_down = False
        self.warn_s = ctx.env_float("VLLM_RINGBUFFER_WARNING_INTERVAL", 60.0)  # envs.py:710

    def start(self, on_failure: Callable[[], None]) -> None:
        ctx, a = self.ctx, self.ctx.args
        cores = os.cpu_count() or 1
        if cores > 1 and "OMP_NUM_THREADS" not in os.environ:
            self.log.record(lines.REDUCING_TORCH_PARALLELISM, cores, 1)
        layout = ctx.layout()
        self.log.record(
            lines.DP_GROUP_LEADER,
            a.node_rank,
            a.node_rank,
            a.master_addr,
            "127.0.0.1",
            a.world_size,
            a.local_world_size,
        )
        self.spawn(list(layout.local_ranks), rank0_here=True)
        self._wait_for_ready()
        threading.Thread(target=self._monitor, args=(on_failure,), name="MultiprocWorkerMonitor", daemon=True).start()

    def start_headless(self) -> None:
        """serve.py:200-218 `run_headless` on a node >= 1: this node's workers only, no DP group leader."""
        cores = os.cpu_count() or 1
        if cores > 1 and "OMP_NUM_THREADS" not in os.environ:
            self.log.record(lines.REDUCING_TORCH_PARALLELISM, cores, 1)
        self.spawn(list(self.ctx.layout().local_ranks), rank0_here=False)
        self._wait_for_ready()

    def monitor_inline(self) -> None:
        """`start_worker_monitor(inline=True)` (multiproc_executor.py:298): block until a worker dies."""
        self._monitor(lambda: None)

    def spawn(self, ranks: list[int], rank0_here: bool) -> None:
        mp = multiprocessing.get_context("spawn")  # cli_env_setup sets VLLM_WORKER_MULTIPROC_METHOD=spawn
        dist_port = _free_port()
        single_node = not self.ctx.args.multinode
        pairs = [mp.Pipe(duplex=True) for _ in ranks[1:]] if single_node and rank0_here else []
        child_ends: list[Connection] = []
        for local_rank, rank in enumerate(ranks):
            ready_r, ready_w = mp.Pipe(duplex=False)
            death_r, death_w = mp.Pipe(duplex=False)
            rpc_child: Connection | None = None
            if rank == 0:
                self.rpc_conn, rpc_child = mp.Pipe(duplex=True)
                child_ends.append(rpc_child)
            peers = [end for end, _ in pairs] if rank == 0 else []
            leader = pairs[local_rank - 1][1] if pairs and rank != 0 else None
            kwargs = {
                "ctx": self.ctx,
                "rank": rank,
                "local_rank": local_rank,
                "dist_port": dist_port,
                "ready": ready_w,
                "death": death_r,
                "rpc": rpc_child,
                "peers": peers,
                "leader": leader,
            }
            proc = mp.Process(target=run_worker_process, kwargs=kwargs, name=f"VllmWorker-{rank}", daemon=True)
            proc.start()
            self.procs.append(proc)
            self.ready.append(ready_r)
            self.death_writers.append(death_w)
            child_ends += [ready_w, death_r]
        for end in child_ends + [conn for pair in pairs for conn in pair]:
            end.close()

    def _wait_for_ready(self) -> None:
        """WorkerProc.wait_for_ready (multiproc_executor.py:736-766): no deadline; a closed pipe is a failure."""
        pending = list(self.ready)
        while pending:
            for conn in wait(pending):
                assert isinstance(conn, Connection)
                pending.remove(conn)
                try:
                    conn.recv()
                except (EOFError, OSError):
                    self.shutdown()  # the finally at multiproc_executor.py:246-254
                    raise Fatal(crashes.workers_not_ready(False), crashes.workers_not_ready(True)) from None

    def _monitor(self, on_failure: Callable[[], None]) -> None:
        """The MultiprocWorkerMonitor thread (multiproc_executor.py:270-298)."""
        sentinels = {proc.sentinel: proc for proc in self.procs}
        died = wait(list(sentinels))
        if self.shutting_down:
            return
        proc = sentinels[died[0]]  # type: ignore[index]
        proc.join(1)
        self.log.record(lines.WORKER_DIED, proc.name, proc.exitcode)
        self.failed.set()
        self.shutdown()
        on_failure()

    def _await_rank0(self, deadline: float | None, method: str) -> object:
        """The response queue's dequeue (shm_broadcast.py:665-712): warns every VLLM_RINGBUFFER_WARNING_INTERVAL
        seconds it waits, raises once the executor shut the queues, times out at the RPC's deadline."""
        conn = self.rpc_conn
        assert conn is not None
        started = time.monotonic()
        warned = 1
        while True:
            if self.failed.is_set():
                raise Fatal(crashes.cancelled(False), crashes.cancelled(True))
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise Fatal(crashes.execute_model_timeout(False), crashes.execute_model_timeout(True))
            if now - started >= self.warn_s * warned:
                self.log.record(lines.SHM_LONG_WAIT, int(self.warn_s))
                warned += 1
            with contextlib.suppress(OSError):
                if conn.poll(0.1):
                    try:
                        return conn.recv()
                    except EOFError:
                        self.failed.wait()  # rank 0 is gone: the monitor is about to say so

    def rpc(self, kind: str) -> None:
        assert self.rpc_conn is not None
        self.rpc_conn.send(Step(kind))
        self._await_rank0(None, kind)

    def execute(self, kind: str) -> None:
        assert self.rpc_conn is not None
        timeout = self.ctx.env_float("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", 300.0)  # envs.py:1675
        try:
            self.rpc_conn.send(Step(kind))
        except OSError:
            self.failed.wait()
        reply = self._await_rank0(time.monotonic() + timeout, "execute_model")
        if isinstance(reply, WorkerError):
            raise Fatal(crashes.worker_failed(reply.text, False), crashes.worker_failed(reply.text, True))
        assert isinstance(reply, Ack)

    def serving(self) -> None:
        if self.rpc_conn is not None:
            with contextlib.suppress(OSError):
                self.rpc_conn.send(FiredUp())

    def wake_s(self) -> float | None:
        return None

    def tick(self) -> None:
        pass

    def shutdown(self) -> None:
        """multiproc_executor.py:459-492: close the death pipes, then `_ensure_worker_termination` (:403-457)."""
        if self.shutting_down:
            return
        self.shutting_down = True
        for writer in self.death_writers:
            writer.close()
        alive = [p for p in self.procs if p.is_alive()]
        if not alive:
            return
        self.log.record(lines.EXECUTOR_WAITING, len(alive))
        grace = self.ctx.env_float("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", 5.0)  # envs.py:1679
        if _wait_gone(alive, grace):
            self.log.record(lines.EXECUTOR_EXITED)
            return
        alive = [p for p in alive if p.is_alive()]
        self.log.record(lines.EXECUTOR_SIGTERM, len(alive))
        for p in alive:
            p.terminate()
        if not _wait_gone(alive, SIGTERM_GRACE_S):
            alive = [p for p in alive if p.is_alive()]
            self.log.record(lines.EXECUTOR_SIGKILL, len(alive))
            for p in alive:
                p.kill()


def _wait_gone(procs: list[BaseProcess], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(p.is_alive() for p in procs):
            return True
        time.sleep(0.1)
    return not any(p.is_alive() for p in procs)


Executor = UniExecutor | MultiprocExecutor


def make_executor(ctx: VllmContext, log: VllmLog) -> Executor:
    """config/parallel.py:883-928: `mp` when the world (or the node count) is larger than one GPU, else `uni`."""
    if ctx.args.world_size > 1 or ctx.args.multinode:
        return MultiprocExecutor(ctx, log)
    return UniExecutor(ctx, log)
