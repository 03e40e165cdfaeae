"""The main process's tokenizer manager: requests out to the scheduler, results back from the detokenizer.

Sending goes through a queue and a thread, like a ZMQ socket's buffer, so an HTTP handler never
blocks on a scheduler that stopped reading; only the waits that SGLang leaves unbounded
(/generate, /get_server_info) wait forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import NoReturn

from supervisor.simulator.loglines import LogWriter
from supervisor.simulator.messages import AbortReq, GenerateReq, InfoOut, InfoReq, SchedulerStats, StatsOut, TokenOut

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
E2E_BUCKETS = (*TTFT_BUCKETS, 600.0, 1200.0, 1800.0, 2400.0)
# SGLang 0.5.16 observability/metrics_collector.py:687-730 (`sglang:queue_time_seconds`), observed when a
# request leaves the waiting queue (req_time_stats.py:746): a request that never starts is never counted.
QUEUE_BUCKETS = (
    0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0,
    1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0,
)


DISCONNECT_CHECK_S = 4.0


class ClientDisconnected(ValueError):
    pass


class ServerStatus(enum.Enum):
    STARTING = "Starting"  # port bound, warm-up not done: /health answers 503 at once
    UP = "Up"  # serving
    SHUTTING_DOWN = "ShuttingDown"  # SIGTERM received, draining: /health answers 503 at once


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.total += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(running)))
        return out


@dataclass(frozen=True)
class MetricsSnapshot:
    stats: SchedulerStats | None
    prompt_tokens_total: int
    generation_tokens_total: int
    num_requests_total: int
    num_aborted_requests_total: int
    realtime_decode_tokens_total: int
    realtime_prefill_tokens_total: int
    ttft: list[tuple[str, float]]
    ttft_sum: float
    e2e: list[tuple[str, float]]
    e2e_sum: float
    queue: list[tuple[str, float]] = field(default_factory=lambda: Histogram(QUEUE_BUCKETS).cumulative())
    queue_sum: float = 0.0


@dataclass
class ReqState:
    rid: str
    prompt_tokens: int
    is_health: bool
    created: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    completion_tokens: int = 0
    text: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    info: dict[str, object] | None = None


@dataclass(frozen=True)
class GenerateResult:
    rid: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    e2e_latency: float


class TokenizerManager:
    def __init__(self, log: LogWriter, to_scheduler: Connection, from_detokenizer: Connection) -> None:
        self.log = log
        self.status = ServerStatus.STARTING
        self.last_receive_tstamp = 0.0
        self._to_scheduler = to_scheduler
        self._from_detokenizer = from_detokenizer
        self._outbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._states: dict[str, ReqState] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._stats: SchedulerStats | None = None
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._num_requests = 0
        self._num_aborted = 0
        self._realtime_decode = 0
        self._realtime_prefill = 0
        self._ttft = Histogram(TTFT_BUCKETS)
        self._e2e = Histogram(E2E_BUCKETS)
        self._queue = Histogram(QUEUE_BUCKETS)
        # The main thread's event loop (server.py), as SGLang's uvicorn loop: every request is read,
        # and every output handed on, by a turn of it. None before it runs.
        self.loop: asyncio.AbstractEventLoop | None = None
        self._model_update_lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._send_loop, name="tokenizer-send", daemon=True).start()
        threading.Thread(target=self._receive_loop, name="tokenizer-recv", daemon=True).start()

    def send(self, message: object) -> None:
        self._outbox.put(message)

    def _send_loop(self) -> None:
        while True:
            message = self._outbox.get()
            with contextlib.suppress(OSError):  # the scheduler is gone: like ZMQ, it never arrives
                self._to_scheduler.send(message)

    def through_loop(self) -> None:
        """Wait for a turn of the event loop, as SGLang's requests and its handle_loop's outputs do:
        while a callback blocks the loop, nothing passes (and nothing waits once the loop ended)."""
        loop = self.loop
        if loop is None:
            return
        turned = threading.Event()
        try:
            loop.call_soon_threadsafe(turned.set)
        except RuntimeError:
            return  # the loop is closed: shutting down
        while not turned.wait(0.5):
            if not loop.is_running():
                return

    def wait_for_model_update(self) -> NoReturn:
        """A callback on the event loop that takes the model-update lock with a blocking acquire (a
        threading lock in async code), while a weight update that never ends holds it: the loop
        stops turning, so no request is read or answered and no output is handed on."""
        self._model_update_lock.acquire()  # the update's hold, never released
        self._model_update_lock.acquire()
        raise AssertionError("a weight update ended")

    def _receive_loop(self) -> None:
        while True:
            try:
                message = self._from_detokenizer.recv()
            except (EOFError, OSError):
                return  # the detokenizer is gone: nothing will ever arrive again
            self.through_loop()
            self.last_receive_tstamp = time.time()
            with self._lock:
                self._dispatch(message)

    def _dispatch(self, message: object) -> None:
        if isinstance(message, TokenOut):
            self._on_tokens(message)
        elif isinstance(message, StatsOut):
            self._stats = message.stats
        elif isinstance(message, InfoOut):
            state = self._states.pop(message.rid, None)
            if state is not None:
                state.info = message.internal_state
                state.done.set()

    def _on_tokens(self, out: TokenOut) -> None:
        now = time.monotonic()
        texts = out.texts or ("",) * len(out.rids)
        for rid, n, finished, text in zip(out.rids, out.new_tokens, out.finished, texts, strict=False):
            state = self._states.get(rid)
            if state is None:
                continue
            if not state.is_health:
                if out.mode == "decode":
                    self._realtime_decode += n
                else:
                    self._realtime_prefill += state.prompt_tokens
                    if state.first_token_at is None:  # admitted: its wait in the queue ends (with its prefill)
                        self._queue.observe(now - state.created)
                if state.first_token_at is None and n > 0:
                    state.first_token_at = now
                    self._ttft.observe(now - state.created)
            state.completion_tokens += n
            state.text.append(text)
            if finished:
                del self._states[rid]
                if not state.is_health:
                    self._prompt_tokens += state.prompt_tokens
                    self._generation_tokens += state.completion_tokens
                    self._num_requests += 1
                    self._e2e.observe(now - state.created)
                state.done.set()

    def _register(self, prompt_tokens: int, is_health: bool) -> ReqState:
        rid = f"{uuid.uuid4().hex[:24]}{next(self._ids):08x}"
        state = ReqState(rid, prompt_tokens, is_health)
        with self._lock:
            self._states[rid] = state
        return state

    def generate(
        self, prompt_tokens: int, max_new_tokens: int, disconnected: Callable[[], bool] = lambda: False
    ) -> GenerateResult:
        """Blocks until the scheduler finishes the request: SGLang sets no deadline either.

        Like SGLang, it looks every 4 s whether the client is still there; if not, the request is
        aborted and ClientDisconnected raised.
        """
        state = self._register(prompt_tokens, is_health=False)
        self.send(GenerateReq(state.rid, prompt_tokens, max_new_tokens))
        while not state.done.wait(DISCONNECT_CHECK_S):
            if disconnected():
                with self._lock:
                    self._states.pop(state.rid, None)
                    self._num_aborted += 1
                self.send(AbortReq(state.rid))
                raise ClientDisconnected(
                    f"Request is disconnected from the client side (type 3). Abort request obj.rid='{state.rid}'"
                )
        return GenerateResult(
            state.rid, "".join(state.text), prompt_tokens, state.completion_tokens, time.monotonic() - state.created
        )

    def health(self, timeout_s: float, poll_s: float) -> bool:
        """SGLang's /health_generate: a one-token request, then any detokenizer output since `tic` is enough."""
        if self.status is not ServerStatus.UP:
            if self.status is ServerStatus.SHUTTING_DOWN:
                self.log.info("Health check request received during shutdown. Returning 503.")
            return False
        tic = time.time()
        state = self._register(1, is_health=True)
        self.send(GenerateReq(state.rid, 1, 1, is_health=True))
        try:
            while time.time() < tic + timeout_s:
                time.sleep(poll_s)
                if self.last_receive_tstamp > tic:
                    return True
        finally:
            with self._lock:
                self._states.pop(state.rid, None)
        tic_time = time.strftime("%H:%M:%S", time.localtime(tic))
        last = time.strftime("%H:%M:%S", time.localtime(self.last_receive_tstamp))
        self.log.error(
            "Health check failed. Server couldn't get a response from detokenizer for last "
            f"{timeout_s:g} seconds. tic start time: {tic_time}. last_heartbeat time: {last}"
        )
        return False

    def internal_state(self) -> dict[str, object]:
        """A round trip to the scheduler with no timeout, as SGLang's /get_server_info."""
        state = self._register(0, is_health=True)
        self.send(InfoReq(state.rid))
        state.done.wait()
        return state.info or {}

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for s in self._states.values() if not s.is_health)

    def metrics(self) -> MetricsSnapshot:
        with self._lock:
            return MetricsSnapshot(
                stats=self._stats,
                prompt_tokens_total=self._prompt_tokens,
                generation_tokens_total=self._generation_tokens,
                num_requests_total=self._num_requests,
                num_aborted_requests_total=self._num_aborted,
                realtime_decode_tokens_total=self._realtime_decode,
                realtime_prefill_tokens_total=self._realtime_prefill,
                ttft=self._ttft.cumulative(),
                ttft_sum=self._ttft.total,
                e2e=self._e2e.cumulative(),
                e2e_sum=self._e2e.total,
                queue=self._queue.cumulative(),
                queue_sum=self._queue.total,
            )
