"""The API server's engine client (vLLM 0.26.0's AsyncLLM over its MPClient, v1/engine/async_llm.py and
v1/engine/core_client.py): requests out to the engine core, outputs back, the stats loggers, and what
happens when the engine core is gone.

- `errored` is AsyncLLM.errored (async_llm.py:1053-1055): the engine is marked dead, or the output handler
  ended. `/health` reads only that (entrypoints/serve/instrumentator/health.py:22-33), so a hung engine
  core answers 200 for as long as it hangs (vllm#46811).
- The output handler (async_llm.py:656-705) ends with `AsyncLLM output_handler failed.` and an
  EngineDeadError once the engine core sends ENGINE_CORE_DEAD or the client's resources are torn
  down; the engine monitor thread (core_client.py:685-713) tears them down when the engine core
  process exits without saying so.
- The logging stat logger (v1/metrics/loggers.py:99-330) prints every VLLM_LOG_STATS_INTERVAL seconds
  (envs.py:829-832, 10 s), at DEBUG (so not at all) while both this and the last interval saw no tokens.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from supervisor.simulator.modelcard import WORDS
from supervisor.simulator.vllm import crashes, lines
from supervisor.simulator.vllm.context import VllmContext
from supervisor.simulator.vllm.log import VllmLog
from supervisor.simulator.vllm.messages import AbortRequest, AddRequest, EngineDead, EngineOutputs, SpecStats
from supervisor.simulator.vllm.metrics import VllmMetrics

DISCONNECT_CHECK_S = 4.0


class EngineDeadError(RuntimeError):
    """vllm.v1.engine.exceptions.EngineDeadError (v1/engine/exceptions.py:9-13)."""

    def __init__(self) -> None:
        super().__init__("EngineCore encountered an issue. See stack trace (above) for the root cause.")


class ClientGone(RuntimeError):
    pass


@dataclass
class Pending:
    rid: str
    prompt_tokens: int
    created: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    tokens: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    dead: bool = False


@dataclass(frozen=True)
class Completion:
    rid: str
    text: str
    prompt_tokens: int
    completion_tokens: int


class StatLogger:
    """LoggingStatLogger (loggers.py:99-330) for engine 0, with SpecDecodingLogging (spec_decode/metrics.py:52-140)."""

    def __init__(self, log: VllmLog, spec: bool) -> None:
        self.log = log
        self.spec = spec
        self.last_log = time.monotonic()
        self.prompt = self.generation = 0
        self.last_prompt_tp = self.last_generation_tp = 0.0
        self.running = self.waiting = 0
        self.kv_usage = 0.0
        self.queries = 0
        self.drafts: list[SpecStats] = []
        self.spec_since = time.monotonic()
        self._lock = threading.Lock()

    def record(self, out: EngineOutputs, generated: int) -> None:
        with self._lock:
            self.prompt += out.prompt_tokens
            self.generation += generated
            self.running, self.waiting, self.kv_usage = out.running, out.waiting, out.kv_usage
            if out.spec is not None:
                self.drafts.append(out.spec)

    def log_stats(self) -> None:
        with self._lock:
            now = time.monotonic()
            elapsed = max(1e-9, now - self.last_log)
            prompt_tp, generation_tp = self.prompt / elapsed, self.generation / elapsed
            self.prompt = self.generation = 0
            self.last_log = now
            idle = not any((prompt_tp, generation_tp, self.last_prompt_tp, self.last_generation_tp))
            self.last_prompt_tp, self.last_generation_tp = prompt_tp, generation_tp
            drafts, self.drafts = self.drafts, []
            spec_elapsed, self.spec_since = max(1e-9, now - self.spec_since), now
        if idle:
            return  # loggers.py:260: logger.debug on an idle engine, not shown at INFO
        self.log.record(
            lines.STATS, 0, prompt_tp, generation_tp, self.running, self.waiting, self.kv_usage * 100, 0.0
        )
        if self.spec and drafts and sum(d.num_drafts for d in drafts):
            n = sum(d.num_drafts for d in drafts)
            proposed = sum(d.num_draft_tokens for d in drafts)
            accepted = sum(d.num_accepted_tokens for d in drafts)
            width = max(len(d.accepted_per_pos) for d in drafts)
            per_pos = [
                sum(d.accepted_per_pos[i] for d in drafts if i < len(d.accepted_per_pos)) / n for i in range(width)
            ]
            self.log.record(
                lines.SPEC_DECODING,
                1 + accepted / n,
                accepted / spec_elapsed,
                proposed / spec_elapsed,
                accepted,
                proposed,
                ", ".join(f"{p:.3f}" for p in per_pos),
                accepted / proposed * 100 if proposed else float("nan"),
            )


class EngineClient:
    def __init__(self, ctx: VllmContext, log: VllmLog, engine: Connection, proc: BaseProcess) -> None:
        self.ctx = ctx
        self.log = log
        self.engine = engine
        self.proc = proc
        self.metrics = VllmMetrics(
            ctx.args.served_model_name,
            ctx.facts.max_model_len,
            ctx.args.speculative.num_speculative_tokens if ctx.args.speculative else None,
            not ctx.args.disable_log_stats,
        )
        self.stats = StatLogger(log, ctx.args.speculative is not None)
        self.engine_dead = False
        self.handler_done = False
        self.client_shut = False
        self.stopping = False  # a deliberate stop (SIGTERM): the output handler is cancelled, not failed
        self._pending: dict[str, Pending] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._words = 0

    @property
    def errored(self) -> bool:
        return self.engine_dead or self.handler_done

    def start(self) -> None:
        threading.Thread(target=self._output_handler, name="output_handler", daemon=True).start()
        threading.Thread(target=self._monitor, name="MPClientEngineMonitor", daemon=True).start()
        if not self.ctx.args.disable_log_stats:
            threading.Thread(target=self._force_log, name="force_log", daemon=True).start()

    def send(self, message: object) -> None:
        with self._send_lock, contextlib.suppress(OSError):
            self.engine.send(message)

    # --- requests ------------------------------------------------------------------------------------------------
    def generate(self, prompt_tokens: int, max_tokens: int, disconnected: Callable[[], bool]) -> Completion:
        """AsyncLLM.generate: no deadline; the client going away aborts the request."""
        if self.errored:
            raise EngineDeadError()
        rid = f"cmpl-{uuid.uuid4().hex}-{next(self._ids)}"
        pending = Pending(rid, prompt_tokens)
        with self._lock:
            self._pending[rid] = pending
        self.send(AddRequest(rid, prompt_tokens, max_tokens))
        while not pending.done.wait(DISCONNECT_CHECK_S):
            if disconnected():
                with self._lock:
                    self._pending.pop(rid, None)
                self.send(AbortRequest(rid))
                raise ClientGone(rid)
        if pending.dead:
            raise EngineDeadError()
        text = "".join(WORDS[(self._words + i) % len(WORDS)] for i in range(pending.tokens))
        self._words += pending.tokens
        return Completion(rid, text, prompt_tokens, pending.tokens)

    def _output_handler(self) -> None:
        try:
            while True:
                try:
                    message = self.engine.recv()
                except (EOFError, OSError):
                    while not self.engine_dead:  # the monitor tears the client down (core_client.py:696-708)
                        time.sleep(0.05)
                    if self.stopping:
                        return  # AsyncLLM.shutdown cancels the handler (async_llm.py:269-271): nothing logged
                    raise EngineDeadError() from None
                if isinstance(message, EngineDead):  # validate_alive (core_client.py:454-457)
                    self.engine_dead = True
                    raise EngineDeadError()
                if isinstance(message, EngineOutputs):
                    self._process(message)
        except EngineDeadError:
            self.log.record(lines.OUTPUT_HANDLER_FAILED, exc_text=crashes.output_handler_dead())
            self.handler_done = True
            self._fail_all()

    def _process(self, out: EngineOutputs) -> None:
        now = time.monotonic()
        generated = 0
        finished: list[tuple[int, int, float, float]] = []
        with self._lock:
            for rid, n in out.new_tokens:
                pending = self._pending.get(rid)
                if pending is None:
                    continue
                if pending.first_token is None and n > 0:
                    pending.first_token = now
                pending.tokens += n
                generated += n
            for done in out.finished:
                pending = self._pending.pop(done.rid, None)
                if pending is not None:
                    ttft = (pending.first_token or now) - pending.created
                    finished.append((pending.prompt_tokens, pending.tokens, ttft, now - pending.created))
                    pending.done.set()
        self.metrics.record(out, generated, finished)
        self.stats.record(out, generated)

    def _fail_all(self) -> None:
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for p in pending:
            p.dead = True
            p.done.set()

    def _force_log(self) -> None:
        interval = self.ctx.env_float("VLLM_LOG_STATS_INTERVAL", 10.0)
        interval = interval if interval > 0 else 10.0
        while not self.errored:
            time.sleep(interval)
            self.stats.log_stats()

    # --- the engine gone -----------------------------------------------------------------------------------------
    def _monitor(self) -> None:
        """core_client.py:685-713: the engine core process ended; unless it said so first, tear down."""
        self.proc.join()
        if self.engine_dead:
            return
        self.engine_dead = True
        self.log.record(lines.ENGINE_CORE_EXITED)
        self.shutdown(None)

    def shutdown(self, timeout: float | None) -> None:
        """MPClient.shutdown (core_client.py:650-662), once: the engine manager's shutdown (v1/utils.py:590-633:
        SIGTERM, wait up to `timeout` (5 s by default), then SIGKILL to whatever of its tree is left)."""
        if self.client_shut:
            return
        self.client_shut = True
        self.log.record(lines.CLIENT_SHUTDOWN_START, "default" if timeout is None else f"{timeout:g}s")
        self.log.record(lines.CLIENT_STOPPING_MANAGER)
        stop_engine(self.proc, 5.0 if timeout is None else timeout, self.log)
        self.log.record(lines.CLIENT_MANAGER_STOPPED)
        self.log.record(lines.CLIENT_CLEANING_UP)
        self.engine_dead = True  # the output task is cancelled: the handler gets EngineDeadError
        self.log.record(lines.CLIENT_SHUTDOWN_COMPLETE)


def stop_engine(proc: BaseProcess, timeout: float, log: VllmLog) -> None:
    """v1/utils.py:590-633 `shutdown(procs, timeout)`."""
    import psutil

    if proc.is_alive():
        with contextlib.suppress(OSError, AttributeError):
            proc.terminate()
    deadline = time.monotonic() + timeout
    while proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.is_alive() and proc.pid is not None:
        log.record(lines.FORCE_KILLING, 1)
        with contextlib.suppress(psutil.Error):  # kill_process_tree (utils/system_utils.py:253-275)
            parent = psutil.Process(proc.pid)
            for child in parent.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
            with contextlib.suppress(OSError):
                os.kill(proc.pid, 9)
        proc.join(1)
