"""What the processes send each other over their pipes (SGLang uses ZMQ for the same traffic).

main --(GenerateReq, AbortReq, InfoReq, FiredUp)--> scheduler TP0 --(Step, FiredUp)--> TP1..n (Ack back)
TP0 --(TokenOut, InfoOut, StatsOut)--> detokenizer --(same, with text)--> main
every scheduler --(ready dict)--> main, once, at the end of its start-up
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GenerateReq:
    rid: str
    prompt_tokens: int
    max_new_tokens: int
    is_health: bool = False


@dataclass(frozen=True)
class AbortReq:
    """The client went away: drop the request wherever it is."""

    rid: str


@dataclass(frozen=True)
class InfoReq:
    rid: str


@dataclass(frozen=True)
class FiredUp:
    """Main printed the ready line: after-ready faults start their clocks."""


@dataclass(frozen=True)
class Step:
    """One forward pass: every rank takes part, as in a TP all-reduce."""

    kind: str  # "prefill" or "decode"


@dataclass(frozen=True)
class Ack:
    rank: int


@dataclass(frozen=True)
class TokenOut:
    """New tokens for each request of one batch; `finished` marks the requests that are done."""

    rids: tuple[str, ...]
    new_tokens: tuple[int, ...]
    finished: tuple[bool, ...]
    mode: str  # "prefill" or "decode"
    texts: tuple[str, ...] = ()  # filled in by the detokenizer


@dataclass(frozen=True)
class SchedulerStats:
    num_running_reqs: int = 0
    num_used_tokens: int = 0
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    num_queue_reqs: int = 0
    cache_hit_rate: float = 0.0
    spec_accept_length: float = 0.0
    spec_accept_rate: float = 0.0
    spec_cap_length: float = 0.0  # DSpark only: 0 for EAGLE
    spec_block_accept_length: float = 0.0
    spec_num_steps: float = 0.0
    spec_num_draft_tokens: float = 0.0
    spec_verify_calls: float = 0.0  # cumulative: the tokenizer's `spec_verify_calls_total` counter
    is_cuda_graph: float = 0.0
    max_total_num_tokens: int = 0


@dataclass(frozen=True)
class StatsOut:
    stats: SchedulerStats


@dataclass(frozen=True)
class InfoOut:
    rid: str
    internal_state: dict[str, object] = field(default_factory=dict)
