"""A vLLM worker: device init, model load, profile (torch.compile), CUDA-graph capture, forwards.

Under the multiproc executor (world size > 1, or several nodes) each rank is its own process
(`run_worker_process`, vLLM's `WorkerProc.worker_main`, multiproc_executor.py:832-935); at world size
1 the engine core runs the same steps itself (the uniproc executor, uniproc_executor.py:46-70), so the
lines carry the engine core's prefix. The order of the steps is the engine core's: the worker loads
in its constructor (multiproc_executor.py:629-637), reports READY, and is then driven by the engine's
broadcasts: `determine_available_memory` (the profile run, which is where torch.compile happens),
`compile_or_warm_up_model` (the capture), then forwards.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import NoReturn

from supervisor.simulator import hangs, kernelcache
from supervisor.simulator.bars import Bar
from supervisor.simulator.collective import LeaderMesh
from supervisor.simulator.gpu.kernel import SpinningKernel
from supervisor.simulator.links import Done, Peer
from supervisor.simulator.messages import Ack, FiredUp, Step
from supervisor.simulator.mirror.torch._inductor.compile_fx import compile_fx_inner
from supervisor.simulator.mirror.torch.distributed.distributed_c10d import all_reduce, broadcast
from supervisor.simulator.mirror.vllm.v1.executor.multiproc_executor import WorkerProc
from supervisor.simulator.mirror.vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager
from supervisor.simulator.mirror.vllm.v1.worker.gpu.model_runner import GPUModelRunner
from supervisor.simulator.modelcard import shard_files
from supervisor.simulator.ncclwait import wait_for
from supervisor.simulator.options import Scenario
from supervisor.simulator.procutil import import_sglang, segfault, start_heartbeat
from supervisor.simulator.rendezvous import meet
from supervisor.simulator.vllm import lines
from supervisor.simulator.vllm.context import VllmContext
from supervisor.simulator.vllm.crashes import load_oom
from supervisor.simulator.vllm.log import VllmLog
from supervisor.simulator.vllm.messages import WorkerError
from supervisor.simulator.weights import WeightReader

MB = 1024 * 1024
LOAD_RATE = 64 * MB
SLOW_RATE = 2 * MB
QUIET_RATE = 8 * MB
SPEC_STEP_COST = 1.74  # a verify step costs this many plain decode steps (as sglang/decode_loop.py)
ATTENTION_BACKENDS = "['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION']"  # platforms/cuda.py:482
AFTER_LOAD = {
    Scenario.DEADLOCK_AFTER_LOAD: hangs.deadlock_forever,
    Scenario.BUSY_HANG_AFTER_LOAD: hangs.spin_forever,
    Scenario.IO_WAIT_AFTER_LOAD: hangs.stuck_in_kernel,
}
ILLEGAL_ACCESS = (
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
    "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


class OomDuringLoad(RuntimeError):
    """torch.OutOfMemoryError while the model is built; the text is the traceback vLLM logs."""


def process_title(name: str) -> str:
    """utils/system_utils.py:184-198 `set_process_title`: `{VLLM_PROCESS_NAME_PREFIX}::{name}` (envs.py:1725)."""
    return f"{os.environ.get('VLLM_PROCESS_NAME_PREFIX', 'VLLM')}::{name}"


def worker_name(ctx: VllmContext, rank: int) -> str:
    """multiproc_executor.py:1032-1046: `Worker`, then `_PP{p}` and `_TP{t}` when those groups have > 1 rank."""
    name = "Worker"
    if ctx.args.pp > 1:
        name += f"_PP{rank // ctx.args.tp}"
    if ctx.args.tp > 1:
        name += f"_TP{rank % ctx.args.tp}"
    return name


def _gib(value: float) -> str:
    return f"{value:.2f}"  # utils/mem_utils.py format_gib: two decimals


class WorkerRuntime:
    """One rank's life. Rank 0 (the output rank) takes the engine's broadcasts and leads every
    collective; the others follow rank 0 (`peers` on rank 0, `leader` elsewhere)."""

    def __init__(self, ctx: VllmContext, rank: int, local_rank: int, log: VllmLog) -> None:
        self.ctx = ctx
        self.rank = rank
        self.local_rank = local_rank
        self.log = log
        self.pace = ctx.settings.pace
        self.scenario = ctx.settings.scenario
        self.reader = WeightReader(shard_files(ctx.args.model), ctx.args.model)
        self.peers: list[Peer] = []
        self.leader: Peer | None = None
        self.fault_at: float | None = None
        self.rng = random.Random(ctx.args.port + rank)

    # --- start-up ------------------------------------------------------------------------------------------------
    def init_device(self, dist_port: int) -> None:
        """gpu_worker.py:297-380: torch.distributed init (parallel_state.py:1615, 1946), then the runner choice."""
        a, layout = self.ctx.args, self.ctx.layout()
        method = f"tcp://{a.master_addr}:{a.master_port}" if a.multinode else f"tcp://127.0.0.1:{dist_port}"
        self.log.record(lines.DIST_INIT, a.world_size, self.rank, self.local_rank, method, "nccl")
        if layout.multinode:  # every rank of every node meets at --master-addr:--master-port, silently
            links = meet(layout, self.rank, a.master_addr)
            if self.rank == 0:
                self.peers = [*links, *self.peers]
            else:
                self.leader = links[0]
        time.sleep(0.3 * self.pace)
        ep = str(self.rank % a.tp) if self.ctx.facts.is_moe else "N/A"
        self.log.record(
            lines.RANK_ASSIGNED, self.rank, a.world_size, 0, self.rank // a.tp, 0, self.rank % a.tp, ep, "N/A"
        )
        if self.ctx.facts.v2_runner:
            self.log.record(lines.V2_MODEL_RUNNER)

    def load_model(self) -> None:
        """The runner's `load_model` (gpu/model_runner.py:276-306, or gpu_model_runner.py:5247-5348 for V1)."""
        facts = self.ctx.facts
        if facts.v2_runner:
            self.log.record(lines.LOADING_FROM_SCRATCH)
        else:
            self.log.record(lines.STARTING_TO_LOAD, self.ctx.args.model)
        tic = time.monotonic()
        self.log.record(lines.ATTENTION_BACKEND, "FLASH_ATTN", ATTENTION_BACKENDS)
        if self.scenario is Scenario.CRASH_ON_LOAD and self.local_rank == 0:
            time.sleep(0.2 * self.pace)
            self.ctx.onset()
            raise OomDuringLoad(load_oom(self.in_worker, facts.v2_runner, facts.llama, self.local_rank, os.getpid()))
        self._load_weights(facts.num_shards, facts.weights_gib, first=True)
        if self.ctx.args.speculative is not None and self.ctx.args.speculative.method != "ngram":
            if not facts.v2_runner:
                self.log.record(lines.LOADING_DRAFTER)
            self._load_weights(1, facts.draft_gib, first=False)
        elapsed = time.monotonic() - tic
        site = lines.MODEL_LOADING_TOOK_V2 if facts.v2_runner else lines.MODEL_LOADING_TOOK_V1
        self.log.record(site, _gib(facts.weights_gib + facts.draft_gib), elapsed)
        self._after_load_faults()

    in_worker = True  # False when the engine core runs this rank itself (uniproc executor)

    def _load_weights(self, shards: int, gib: float, first: bool) -> None:
        """default_loader.py:410-431 over weight_utils.py:840-930's safetensors iterator; the bar on rank 0 only."""
        settings = self.ctx.settings
        self.log.record(lines.FILESYSTEM, "EXT4", gib * self.ctx.args.world_size, 1007.51)
        self.log.record(lines.NO_PREFETCH, "EXT4")
        tic = time.monotonic()
        if first and self.scenario is Scenario.SLOW_LOAD:
            self.ctx.onset()
        if first and self.scenario is Scenario.QUIET_LOAD:
            self.ctx.onset()
            self.reader.read_for(settings.quiet_seconds, QUIET_RATE, busy_fraction=0.4)
        rate = SLOW_RATE if self.scenario is Scenario.SLOW_LOAD else LOAD_RATE
        hold = int(settings.mem_mb * MB * (0.9 if first else 0.1) / shards)
        seconds = settings.shard_seconds if first else 0.5 * self.pace
        bar = None
        if self.rank == 0:  # weight_utils.py:637-640 enable_tqdm: torch.distributed rank 0 only
            bar = Bar(
                shards, self.log.stderr, desc="Loading safetensors checkpoint shards", bar_format=VLLM_SHARDS_FORMAT
            )
        for _ in range(shards):
            self.reader.read_for(seconds, rate, hold)
            if bar is not None:
                bar.update()
        if bar is not None:
            bar.close()
        self.log.record(lines.LOADING_WEIGHTS_TOOK, time.monotonic() - tic)

    def _after_load_faults(self) -> None:
        """The hangs right after `Model loading took`: inside the worker's constructor, before READY, so
        nothing further is printed anywhere and the port never listens."""
        hang = AFTER_LOAD.get(self.scenario)
        if hang is not None:
            self.ctx.onset()
            hang()
        if self.scenario is Scenario.LOCK_GIL_AFTER_LOAD:
            self.ctx.onset()
            hangs.hold_gil_forever(GPUModelRunner().load_model)
        if self.scenario is Scenario.GPU_SLEEP_AFTER_LOAD:
            self.ctx.onset()
            hangs.gpu_sleep(self.ctx.settings.gpu_file)

    def profile(self) -> None:
        """gpu_worker.py:448-607 `determine_available_memory`: the profile run compiles the model first."""
        args, facts, settings = self.ctx.args, self.ctx.facts, self.ctx.settings
        if args.torch_compile:
            tic = time.monotonic()
            root = os.environ.get("VLLM_CACHE_ROOT", os.path.expanduser("~/.cache/vllm"))
            cache = f"{root}/torch_compile_cache/{_hash(args.model)}/rank_{self.rank}_0/backbone"
            self.log.record(lines.COMPILE_CACHE_DIR, cache)
            warm = kernelcache.entry(os.environ, "vllm_backbone")
            cached = warm is not None and warm.is_file()
            if self.scenario is Scenario.LONG_COMPILE:
                self.ctx.onset()  # Dynamo and inductor at one core: no line, no read, no memory change, GPU idle
                compile_fx_inner("backbone", 8, settings.compile_seconds)
            time.sleep(0.2 * self.pace)
            self.log.record(lines.DYNAMO_TIME, time.monotonic() - tic)
            if cached:
                self.log.record(
                    lines.AOT_LOADED,
                    f"{root}/torch_compile_cache/torch_aot_compile/"
                    f"{_hash(args.model + 'aot')}/rank_{self.rank}_0/model",
                )
            cold = settings.prefill_compile_seconds
            held = import_sglang(kernelcache.compile_seconds(os.environ, "vllm_backbone", cold))
            kernelcache.store(os.environ, "vllm_backbone")
            if not cached:
                self.log.record(lines.CACHE_THE_GRAPH, facts.compile_range)
                self.log.record(lines.COMPILING_GRAPH, facts.compile_range, time.monotonic() - tic)
            del held
            self.log.record(lines.TORCH_COMPILE_TOOK, time.monotonic() - tic)
        tic = time.monotonic()
        time.sleep(0.2 * self.pace)
        self.log.record(lines.PROFILING_RUN_TOOK, time.monotonic() - tic)
        self.log.record(lines.AVAILABLE_KV_MEMORY, _gib(facts.available_kv_gib))

    def capture(self) -> None:
        """gpu_worker.py:746-790: the capture (rank 0 draws the bars), then `Graph capturing finished` on every rank."""
        args, facts = self.ctx.args, self.ctx.facts
        if not args.cuda_graphs:
            return  # gpu_worker.py:780: no capture_model() under --enforce-eager
        tic = time.monotonic()
        spec = args.speculative is not None and args.speculative.method != "ngram"
        if facts.v2_runner:
            groups = [
                ("Capturing CUDA graphs (PIECEWISE)", facts.capture_sizes),
                ("Capturing CUDA graphs (FULL)", facts.full_sizes),
            ]
            if spec:  # speculator.py:101-126: the draft's prefill graphs, then (more than one step) its decode graphs
                groups.append(("Capturing prefill CUDA graphs (PIECEWISE)", facts.capture_sizes))
                if args.speculative is not None and args.speculative.num_speculative_tokens > 1:
                    groups.append(("Capturing decode CUDA graphs (FULL)", facts.full_sizes))
        else:
            decode = tuple(s for s in facts.capture_sizes if s <= facts.max_num_seqs)
            groups = [
                ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", facts.capture_sizes),
                ("Capturing CUDA graphs (decode, FULL)", decode),
            ]
        hang_in = len(groups) - 1 if spec else 1  # the draft's capture with speculation, else the FULL graphs
        for index, (desc, sizes) in enumerate(groups):
            self._capture_group(
                desc,
                tuple(sorted(sizes, reverse=True)),
                hang=self.scenario is Scenario.BUSY_CAPTURE_HANG and index == hang_in,
            )
        site = lines.GRAPH_CAPTURING_FINISHED_V2 if facts.v2_runner else lines.GRAPH_CAPTURING_FINISHED_V1
        self.log.record(site, time.monotonic() - tic, facts.graph_gib)

    def _capture_group(self, desc: str, sizes: tuple[int, ...], hang: bool) -> None:
        if not sizes:
            return
        bar = Bar(len(sizes), self.log.stderr, desc=desc) if self.rank == 0 else None
        per = 1.0 * self.pace / max(1, len(sizes))
        for i, _ in enumerate(sizes):
            if hang and i == len(sizes) // 3:
                self.ctx.onset()  # a kernel of the captured forward never ends: one core spins in the synchronize
                self._spin_in_capture(sizes[i:])
            time.sleep(per)
            if bar is not None:
                bar.update()
        if bar is not None:
            bar.close()

    def _spin_in_capture(self, sizes: tuple[int, ...]) -> NoReturn:
        gpu = self.ctx.settings.gpu_file
        CudaGraphManager(sizes, lambda bs: SpinningKernel(gpu)).capture()
        raise AssertionError("a never-ending kernel finished")

    # --- serving -------------------------------------------------------------------------------------------------
    def arm(self) -> None:
        """The server listens: a per-rank fault starts its clock."""
        if self.fault_at is None and self.my_fault() is not None:
            self.fault_at = time.monotonic() + self.ctx.settings.fault_after_s

    def my_fault(self) -> Scenario | None:
        scenario = self.scenario
        if scenario is Scenario.RANK_DIES and self.rank == self.ctx.layout().victim():
            return scenario
        if scenario in (Scenario.CRASH_AFTER_READY, Scenario.HEALTH_HANGS, Scenario.SERVING_STALL) and self.rank == 0:
            return scenario
        return None

    def due(self) -> bool:
        return self.fault_at is not None and time.monotonic() >= self.fault_at

    def wait_s(self) -> float | None:
        if self.fault_at is None or self.my_fault() is not Scenario.RANK_DIES:
            return None
        return max(0.0, self.fault_at - time.monotonic())

    def die(self) -> NoReturn:
        """RANK_DIES: a SIGSEGV with no dump (vLLM's processes do not enable faulthandler)."""
        self.ctx.onset()
        segfault()

    def forward(self, kind: str) -> WorkerError | None:
        """One forward on rank 0 and its all-reduce with every peer; a fault that is due happens inside it."""
        if self.due():
            fault = self.my_fault()
            if fault is Scenario.HEALTH_HANGS:
                self.ctx.onset()
                hangs.wait_for_collective()  # the forward's thread waits for good on something that never comes
            if fault is Scenario.SERVING_STALL and kind == "decode":
                self.ctx.onset()
                hangs.gpu_sleep(self.ctx.settings.gpu_file)  # a decode kernel that never ends
            if fault is Scenario.CRASH_AFTER_READY:
                self.fault_at = None
                self.ctx.onset()
                return WorkerError("CUDA error: an illegal memory access was encountered")
        spec = self.ctx.args.speculative is not None
        time.sleep(self.ctx.settings.decode_step_s * (SPEC_STEP_COST if spec else 1.0))
        if self.peers:
            LeaderMesh(self.peers, self.ctx.settings.gpu_file).forward(
                kind if kind in ("prefill", "decode") else "decode"
            )
        return None

    def collective_startup(self, kind: str) -> None:
        """Rank 0's part of a start-up broadcast: its peers run the same step, rank 0 waits for all of them."""
        for peer in self.peers:
            with contextlib.suppress(OSError):
                peer.send(Step(kind))
        if kind == "profile":
            self.profile()
        elif kind == "capture":
            self.capture()
        if self.peers:
            all_reduce(self.peers, lambda m: isinstance(m, Ack))

    def fired_up(self) -> None:
        self.arm()
        for peer in self.peers:
            with contextlib.suppress(OSError):
                peer.send(FiredUp())

    def follow(self) -> NoReturn:
        """A rank other than 0: run rank 0's broadcasts until it is gone."""
        leader = self.leader
        assert leader is not None
        gpu = self.ctx.settings.gpu_file

        def dequeue() -> object:
            while True:
                if self.due():
                    self.die()
                try:
                    message = broadcast(leader, self.wait_s())
                except EOFError:
                    hangs.wait_for_collective()  # rank 0 is gone: the next broadcast never comes
                if message is not None:
                    return message

        def handle(message: object) -> None:
            if isinstance(message, FiredUp):
                self.arm()
            elif isinstance(message, Step) and message.kind in ("profile", "capture"):
                self.profile() if message.kind == "profile" else self.capture()
                leader.send(Ack(self.rank))
            elif isinstance(message, Step):
                with contextlib.suppress(OSError):
                    leader.send(Ack(self.rank))
                if wait_for([leader], Done, gpu):
                    self.arm()

        WorkerProc(dequeue, handle).worker_busy_loop()


VLLM_SHARDS_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n"


def _hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """multiproc_executor.py:846-854: SIGTERM raises SystemExit once."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit()


def _watch_death_pipe(death: Connection, log: VllmLog) -> None:
    """multiproc_executor.py:786-807: the executor closed its end (or died): the queues shut, the worker ends."""
    try:
        death.recv()
    except (EOFError, OSError):
        log.record(lines.PARENT_EXITED)
        os._exit(0)


def run_worker_process(
    ctx: VllmContext,
    rank: int,
    local_rank: int,
    dist_port: int,
    ready: Connection,
    death: Connection,
    rpc: Connection | None,
    peers: Sequence[Connection],
    leader: Connection | None,
) -> None:
    """`WorkerProc.worker_main` (multiproc_executor.py:832-935): `VLLM::Worker`, then `VLLM::Worker_TPn`."""
    import setproctitle

    modules = import_sglang(ctx.settings.import_seconds)
    setproctitle.setproctitle(process_title("Worker"))
    log = VllmLog()
    log.decorate("Worker")  # multiproc_executor.py:1016-1020, before the parallel groups exist
    if ctx.settings.scenario is Scenario.IGNORE_SIGTERM:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, _on_sigterm)
    start_heartbeat("ProcessGroupNCCL-watchdog")
    runtime = WorkerRuntime(ctx, rank, local_rank, log)
    runtime.peers = list(peers)
    runtime.leader = leader
    try:
        runtime.init_device(dist_port)
        name = worker_name(ctx, rank)
        setproctitle.setproctitle(process_title(name))
        log.decorate(name)
        runtime.load_model()
    except OomDuringLoad as e:
        log.record(lines.WORKER_FAILED_TO_START, exc_text=str(e))
        return  # worker_main swallows it: the process ends 0, the executor sees the ready pipe close
    threading.Thread(target=_watch_death_pipe, args=(death, log), name="DeathPipeMonitor", daemon=True).start()
    ready.send({"status": "READY", "rank": rank})
    ready.close()
    if rpc is None:
        runtime.follow()
    serve_rank0(runtime, rpc, log)
    del modules


def serve_rank0(runtime: WorkerRuntime, rpc: Connection, log: VllmLog) -> NoReturn:
    """Rank 0 in its own process: the engine's broadcasts, one at a time, each answered."""

    def dequeue() -> object:
        while True:
            if runtime.due() and runtime.my_fault() is Scenario.RANK_DIES:
                runtime.die()
            if wait([rpc], runtime.wait_s()):
                try:
                    return rpc.recv()
                except (EOFError, OSError):
                    os._exit(0)  # the engine core is gone; the death pipe says the same

    def handle(message: object) -> None:
        if isinstance(message, FiredUp):
            runtime.fired_up()
            return
        if not isinstance(message, Step):
            return
        if message.kind in ("profile", "capture"):
            runtime.collective_startup(message.kind)
            rpc.send(Ack(runtime.rank))
            return
        error = runtime.forward(message.kind)
        if error is not None:
            log.record(lines.WORKER_HIT_EXCEPTION, exc_text=worker_exception())
        rpc.send(error if error is not None else Ack(runtime.rank))

    WorkerProc(dequeue, handle).worker_busy_loop()


def worker_exception() -> str:
    from supervisor.simulator.vllm.crashes import forward_crash

    return forward_crash() + ILLEGAL_ACCESS
