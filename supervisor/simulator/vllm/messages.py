"""What the simulated vLLM processes send each other over their pipes (vLLM uses ZMQ and shared-memory
message queues for the same traffic).

API server <-> engine core (core_client.py / core.py's sockets): AddRequest, AbortRequest, Serving one way;
EngineReady, EngineOutputs, EngineDead (`ENGINE_CORE_DEAD`, core.py:998) the other.
Engine core -> worker 0 (the executor's broadcast queue): messages.Step with kind `profile`, `capture`
or a forward's; worker 0 relays each to its peers (links.py), collects their Ack and answers with an
Ack, or a WorkerError when its forward raised (multiproc_executor.py:995-1012 `FAILURE`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class AddRequest:
    rid: str
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class AbortRequest:
    rid: str


@dataclass(frozen=True)
class Serving:
    """The API server listens: faults that begin a while after ready start their clocks."""


@dataclass(frozen=True)
class EngineReady:
    kv_tokens: int


@dataclass(frozen=True)
class SpecStats:
    """SpecDecodingStats (v1/spec_decode/metrics.py:17-49) for one step."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()


@dataclass(frozen=True)
class Finished:
    rid: str
    reason: str  # FinishReason's string (v1/engine/__init__.py:30)


@dataclass(frozen=True)
class EngineOutputs:
    """One engine step: new tokens per request, the scheduler's stats (None with --disable-log-stats)."""

    new_tokens: tuple[tuple[str, int], ...]
    finished: tuple[Finished, ...]
    prompt_tokens: int  # computed in this step (prefills)
    running: int
    waiting: int
    kv_usage: float
    spec: SpecStats | None = None
    log_stats: bool = True
    prefix_queries: int = 0
    finished_prompt_tokens: tuple[int, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class EngineDead:
    """`ENGINE_CORE_DEAD`: sent by an engine core that hit a fatal error, just before it exits."""


@dataclass(frozen=True)
class WorkerError:
    """A worker's forward raised: the executor's RPC fails with this text."""

    text: str
