"""The engine core process (`VLLM::EngineCore`, vLLM 0.26.0 v1/engine/core.py): start-up, then the busy loop.

Start-up as `EngineCore.__init__` runs it (core.py:98-240): the config line, the executor (workers built
and loaded), `_initialize_kv_caches` (the profile run with torch.compile, the KV cache lines, the
capture), then `init engine ... took`. The busy loop (core.py:1357-1404) takes requests from the API
server, steps the executor and sends outputs back. A fatal error is logged with its traceback, the
API server told (`ENGINE_CORE_DEAD`), the executor shut down, and the process ends 1 with
multiprocessing's own print of the exception (core.py:1328-1345).
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import FrameType
from typing import NoReturn

from supervisor.simulator.options import Scenario
from supervisor.simulator.procutil import import_sglang, start_heartbeat
from supervisor.simulator.vllm import lines
from supervisor.simulator.vllm.context import VllmContext
from supervisor.simulator.vllm.executor import Executor, Fatal, make_executor
from supervisor.simulator.vllm.log import VllmLog
from supervisor.simulator.vllm.messages import (
    AbortRequest,
    AddRequest,
    EngineDead,
    EngineOutputs,
    EngineReady,
    Finished,
    Serving,
    SpecStats,
)
from supervisor.simulator.vllm.worker import process_title

EXECUTOR_FAILED = "EXECUTOR_FAILED"  # EngineCoreRequestType.EXECUTOR_FAILED, put by the executor's failure callback
WAKEUP = "WAKEUP"
ACCEPT_RATE_OK = 0.71  # draft tokens accepted, of those proposed
ACCEPT_RATE_LOW = 0.15  # the seed incident's EAGLE-3 drafter on vLLM


@dataclass
class Req:
    rid: str
    prompt_tokens: int
    max_tokens: int
    generated: int = 0


def keep_probability(rate: float, k: int) -> float:
    """Verification keeps a prefix of the k drafted tokens: with each next one kept with probability q, the
    accepted share of drafted tokens (spec_decode/metrics.py:104-107) is (q + q^2 + ... + q^k) / k; solve for q."""
    if k <= 0:
        return 0.0
    low, high = 0.0, 1.0
    for _ in range(40):
        q = (low + high) / 2
        if sum(q**i for i in range(1, k + 1)) / k < rate:
            low = q
        else:
            high = q
    return (low + high) / 2


def engine_config(ctx: VllmContext) -> str:
    """VllmConfig.__str__ (config/vllm.py:2094-2126), with this command line's values."""
    a, f = ctx.args, ctx.facts
    spec = (
        None
        if a.speculative is None
        else (
            f"SpeculativeConfig(method={a.speculative.method!r}, model={a.speculative.model!r}, "
            f"num_spec_tokens={a.speculative.num_speculative_tokens})"
        )
    )
    mode = "<CompilationMode.VLLM_COMPILE: 3>" if a.torch_compile else "<CompilationMode.NONE: 0>"
    graphs = "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>" if a.cuda_graphs else "<CUDAGraphMode.NONE: 0>"
    return (
        f"model={a.model!r}, speculative_config={spec}, tokenizer={a.model!r}, skip_tokenizer_init=False, "
        "tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, "
        f"dtype=torch.bfloat16, max_seq_len={f.max_model_len}, download_dir=None, load_format=auto, "
        f"tensor_parallel_size={a.tp}, pipeline_parallel_size={a.pp}, data_parallel_size={a.dp}, "
        "decode_context_parallel_size=1, dcp_comm_backend=ag_rs, "
        f"disable_custom_all_reduce={a.multinode}, quantization=None, quantization_config=None, "
        f"enforce_eager={a.enforce_eager}, enable_return_routed_experts=False, kv_cache_dtype=auto, "
        "device_config=cuda, structured_outputs_config=StructuredOutputsConfig(backend='auto'), "
        "observability_config=ObservabilityConfig(), "
        f"seed={a.seed}, served_model_name={a.served_model_name}, enable_prefix_caching=True, "
        f"enable_chunked_prefill=True, pooler_config=None, compilation_config={{'mode': {mode}, "
        f"'cudagraph_mode': {graphs}, 'cudagraph_capture_sizes': {list(f.capture_sizes)}, "
        f"'max_cudagraph_capture_size': {max(f.capture_sizes, default=0)}}}, kernel_config=KernelConfig()"
    )


class EngineCore:
    def __init__(self, ctx: VllmContext, api: Connection, log: VllmLog) -> None:
        self.ctx = ctx
        self.api = api
        self.log = log
        self.inputs: queue.Queue[object] = queue.Queue()
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.shutdown_requested = False
        self.rng = random.Random(ctx.args.port)
        spec = ctx.args.speculative
        self.spec_k = spec.num_speculative_tokens if spec is not None else 0
        low = ctx.settings.scenario is Scenario.LOW_ACCEPT
        self.keep = keep_probability(ACCEPT_RATE_LOW if low else ACCEPT_RATE_OK, self.spec_k)
        self.executor: Executor = make_executor(ctx, log)
        self._send_lock = threading.Lock()
        # Issue 51 (QUEUE_WEDGE, vLLM's #53130 and SGLang's #40809): from `wedge_at` on the scheduler admits no
        # waiting request; the busy loop turns, the running batch drains, /health (a flag) stays 200.
        self.wedge_at: float | None = None
        self.wedged = False

    # --- start-up ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """core.py:98-240: the config line, the executor, `_initialize_kv_caches`; a failure is `EngineCore failed
        to start.` and exit 1 (core.py:1328-1330)."""
        facts = self.ctx.facts
        self.log.record(lines.INIT_ENGINE, lines.VLLM_VERSION, engine_config(self.ctx))
        try:
            self.executor.start(lambda: self.inputs.put(EXECUTOR_FAILED))
            tic = time.monotonic()
            self.executor.rpc("profile")
            # compilation's share: the profile broadcast less its profile run (monitor.py:47-53 counts it apart)
            compiled = (
                max(0.0, time.monotonic() - tic - 0.2 * self.ctx.settings.pace) if self.ctx.args.torch_compile else 0.0
            )
            self.log.record(lines.GPU_KV_CACHE_SIZE, f"{facts.kv_tokens:,}")
            self.log.record(lines.MAX_CONCURRENCY, f"{facts.max_model_len:,}", facts.max_concurrency)
            self.executor.rpc("capture")
        except Fatal as e:
            self.log.record(lines.ENGINE_FAILED_TO_START, exc_text=e.text)
            self.executor.shutdown()
            self._exit_with(e)
        if self.ctx.args.torch_compile:
            self.log.record(lines.INIT_ENGINE_TOOK_COMPILED, time.monotonic() - tic, compiled)
        else:
            self.log.record(lines.INIT_ENGINE_TOOK, time.monotonic() - tic)

    def _exit_with(self, error: Fatal) -> NoReturn:
        """multiprocessing's `_bootstrap` prints the re-raised exception, then the process ends 1."""
        self.log.stderr(f"Process {process_name(self.ctx)}:\n{error.bootstrap.rstrip()}\n")
        sys.stdout.flush()
        os._exit(1)

    # --- the busy loop -------------------------------------------------------------------------------------------
    def serve(self) -> NoReturn:
        threading.Thread(target=self._read_inputs, name="process_input_sockets", daemon=True).start()
        self._send(EngineReady(self.ctx.facts.kv_tokens))
        try:
            while True:
                self._take_inputs()
                if self.shutdown_requested:
                    self._shut_down()
                if self.waiting or self.running:
                    self._step()
        except Fatal as e:
            self.log.record(lines.ENGINE_FATAL, exc_text=e.text)
            self._send(EngineDead())  # core.py:1569-1580: ENGINE_CORE_DEAD before anything else
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # core.py:1337-1340, before engine_core.shutdown()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            self.executor.shutdown()
            self._exit_with(e)

    def _read_inputs(self) -> None:
        """The input socket thread (core.py:1582-1690): requests into the queue the busy loop reads."""
        while True:
            try:
                message = self.api.recv()
            except (EOFError, OSError):
                return  # the front end is gone; vLLM's engine core does not notice either
            self.inputs.put(message)

    def _take_inputs(self) -> None:
        block = not (self.waiting or self.running)
        while True:
            try:
                if block:
                    wake = self.executor.wake_s()
                    message = self.inputs.get(timeout=wake) if wake is not None else self.inputs.get()
                else:
                    message = self.inputs.get_nowait()
            except queue.Empty:
                self.executor.tick()
                return
            block = False
            self._handle(message)

    def _handle(self, message: object) -> None:
        if isinstance(message, AddRequest):
            if not self.shutdown_requested:
                self.waiting.append(Req(message.rid, message.prompt_tokens, message.max_tokens))
        elif isinstance(message, AbortRequest):
            self.waiting = deque(r for r in self.waiting if r.rid != message.rid)
            self.running = [r for r in self.running if r.rid != message.rid]
        elif isinstance(message, Serving):
            self.executor.serving()
            if self.ctx.settings.scenario is Scenario.QUEUE_WEDGE:
                self.wedge_at = time.monotonic() + self.ctx.settings.fault_after_s
        elif message == EXECUTOR_FAILED:
            from supervisor.simulator.vllm import crashes

            raise Fatal(crashes.executor_failed(False), crashes.executor_failed(True))

    def _wedge_due(self) -> bool:
        if not self.wedged and self.wedge_at is not None and time.monotonic() >= self.wedge_at:
            self.wedged = True
            self.ctx.onset()  # nothing is printed: vLLM said nothing either
        return self.wedged

    def _step(self) -> None:
        """One engine step: prefill what waits, or decode what runs; the scheduler's stats go with the outputs."""
        if self._wedge_due() and not self.running:
            self._empty_step()
            return
        prefill = bool(self.waiting) and not self.wedged
        self.executor.execute("prefill" if prefill else "decode")
        new: list[tuple[str, int]] = []
        prompt_tokens = 0
        spec = SpecStats() if self.spec_k else None
        if prefill:
            batch = list(self.waiting)
            self.waiting.clear()
            for req in batch:
                prompt_tokens += req.prompt_tokens
                req.generated = 1 if req.max_tokens > 0 else 0
                new.append((req.rid, req.generated))
            self.running.extend(batch)
        else:
            accepted_pos = [0] * self.spec_k
            drafts = accepted = 0
            for req in self.running:
                n = 1
                if self.spec_k:
                    hits = self._accepted()
                    drafts += 1
                    accepted += hits
                    for pos in range(hits):
                        accepted_pos[pos] += 1
                    n += hits
                n = min(n, req.max_tokens - req.generated)
                req.generated += n
                new.append((req.rid, n))
            if self.spec_k:
                spec = SpecStats(drafts, drafts * self.spec_k, accepted, tuple(accepted_pos))
        done = [r for r in self.running if r.generated >= r.max_tokens]
        self.running = [r for r in self.running if r.generated < r.max_tokens]
        used = sum(r.prompt_tokens + r.generated for r in self.running)
        self._send(
            EngineOutputs(
                new_tokens=tuple(new),
                finished=tuple(Finished(r.rid, "length") for r in done),
                prompt_tokens=prompt_tokens,
                running=len(self.running),
                waiting=len(self.waiting),
                kv_usage=min(1.0, used / max(1, self.ctx.facts.kv_tokens)),
                spec=spec if not prefill else None,
                log_stats=not self.ctx.args.disable_log_stats,
                prefix_queries=prompt_tokens,
                finished_prompt_tokens=tuple(r.prompt_tokens for r in done),
            )
        )

    def _empty_step(self) -> None:
        """A wedged scheduler's step (vLLM #53130): requests wait, nothing is scheduled, no forward runs;
        the step's stats still carry the scheduler's gauges (running 0, the waiting count)."""
        time.sleep(self.ctx.settings.decode_step_s)
        self._send(
            EngineOutputs(
                new_tokens=(),
                finished=(),
                prompt_tokens=0,
                running=0,
                waiting=len(self.waiting),
                kv_usage=0.0,
                spec=None,
                log_stats=not self.ctx.args.disable_log_stats,
                prefix_queries=0,
                finished_prompt_tokens=(),
            )
        )

    def _accepted(self) -> int:
        """Accepted draft tokens of one draft: a prefix of the k proposed, each kept with the acceptance rate."""
        hits = 0
        while hits < self.spec_k and self.rng.random() < self.keep:
            hits += 1
        return hits

    def _send(self, message: object) -> None:
        with self._send_lock, contextlib.suppress(OSError):
            self.api.send(message)

    # --- shutdown ------------------------------------------------------------------------------------------------
    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """core.py:1305-1318: log, mark the shutdown requested, wake the busy loop."""
        self.log.record(lines.ENGINE_SIGNAL, signal.Signals(signum).name)
        self.shutdown_requested = True
        self.inputs.put(WAKEUP)

    def _shut_down(self) -> NoReturn:
        """core.py:1423-1466 with `shutdown_timeout` 0 (abort), then SystemExit out of the busy loop."""
        self.log.record(lines.ENGINE_SHUTDOWN_START, "abort", 0)
        unfinished = len(self.waiting) + len(self.running)
        if unfinished:
            self.log.record(lines.ENGINE_SHUTDOWN_ABORTING, unfinished)
        self.log.record(lines.ENGINE_SHUTDOWN_DONE)
        self.log.record(lines.ENGINE_EXITING)
        self.executor.shutdown()
        sys.stdout.flush()
        os._exit(0)


def process_name(ctx: VllmContext) -> str:
    """engine/utils.py:167 and core.py:1264-1269: `EngineCore_DP{i}` only with data parallelism."""
    return f"EngineCore_DP{0}" if ctx.args.dp > 1 else "EngineCore"


def run_engine_core(ctx: VllmContext, api: Connection) -> None:
    """`EngineCoreProc.run_engine_core` (core.py:1252-1345) in its spawned process."""
    import setproctitle

    modules = import_sglang(ctx.settings.import_seconds)
    name = process_name(ctx)
    setproctitle.setproctitle(process_title(name))
    log = VllmLog()
    log.decorate(name)
    ignore = ctx.settings.scenario is Scenario.IGNORE_SIGTERM
    if ignore:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    start_heartbeat("EngineCoreOutputQueueThread")
    engine = EngineCore(ctx, api, log)
    engine.start()
    if not ignore:  # core.py:1317-1318: installed only once the engine core is built
        signal.signal(signal.SIGTERM, engine.on_signal)
        signal.signal(signal.SIGINT, engine.on_signal)
    engine.serve()
    del modules
