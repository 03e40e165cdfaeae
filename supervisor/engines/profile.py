"""What differs between the engines the daemon supervises, held as data: one profile per engine.

The probes, the watchdog's inputs, check-config and the launch take a profile; nothing else in the
daemon names an engine. Every string here is read from the engine's own source (SGLang 0.5.16,
vLLM 0.26.0); docs/ENGINES.md cites where, and says what differs per engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Engine = Literal["sglang", "vllm"]
ENGINES: tuple[Engine, ...] = ("sglang", "vllm")

# What a start-up line says happened. The log parser turns these into phases (probes/logs.py).
Milestone = Literal[
    "dist_init",  # distributed init begins
    "weights_begin",  # a model's weights start loading (a second one on a rank is the draft's)
    "weights_end",  # a model's weights are loaded (`type=` may name the draft's class)
    "draft_begin",  # the speculative draft model starts loading (vLLM says so in words)
    "kv_begin",  # the KV cache's sizing begins (vLLM: its profiling run, right after the models load)
    "kv_allocated",  # the KV cache is sized or allocated (vLLM: its profiling run, compile included)
    "graph_begin",  # CUDA graph capture begins
    "draft_graph_begin",  # the draft model's own CUDA graph capture begins (SGLang)
    "warmup_begin",  # the engine's own warm-up begins (vLLM: its kernel warm-up after capture, JIT included)
    "http_up",  # the HTTP server is up
]

# How the server's own health endpoint behaves.
#   generates: /health runs a one-token generation (SGLang): a hung scheduler fails it.
#   flag: /health reads a flag (vLLM, vllm#46811): 200 over a hung engine, 503 once it is dead;
#         the daemon adds a canary generation when the server's gauges say it is idle.
HealthStyle = Literal["generates", "flag"]

# The line prefix the engine's logger writes.
#   bracket: `[2026-11-29 14:00:00 TP0] ` (SGLang)
#   level: `(Worker_TP1 pid=7) INFO 12-06 00:10:11 [core.py:93] ` (vLLM; the process part on children)
PrefixStyle = Literal["bracket", "level"]


@dataclass(frozen=True)
class LogGrammar:
    """The lines a start-up and a serving server print, as substrings (matched anywhere in the
    message after the prefix; versions reorder lines, so never as a sequence)."""

    prefix: PrefixStyle
    milestones: tuple[tuple[str, Milestone], ...]  # first match wins
    ready: tuple[str, ...]  # the ready line, a phase hint only: readiness is proven by port and health
    errors: tuple[str, ...]  # markers of an error line worth keeping
    health_failed: str  # the server's own failed health check ("" when it prints none)
    stats: str  # the periodic serving-statistics line ("Decode batch", "Avg prompt throughput")
    # Lines the engine repeats while it waits on something that may never come: output, not progress
    # (vLLM's shm broadcast queue says it waited 60 s more, at start-up and while serving).
    waiting: tuple[str, ...]
    # SGLang ranks the draft's load after every target stage (some builds load it after the target's
    # graphs); vLLM loads the drafter right after the target's weights, before KV cache and graphs.
    draft_after_target: bool


@dataclass(frozen=True)
class Titles:
    """Process titles (setproctitle) -> roles. A rank process is role `scheduler` for every engine:
    the process that runs one tensor-parallel rank's forward passes."""

    prefix: str  # every child title the engine sets starts with it (an orphan's proof of kind)
    rank: tuple[str, ...]  # title prefixes of rank processes; the rank is the number after `TP`
    # Title prefixes of a process that runs rank 0 itself when no rank process exists (vLLM's
    # EngineCore at tp 1, whose uni-process executor runs the model in place).
    rank_when_alone: tuple[str, ...]
    detokenizer: tuple[str, ...]
    controller: tuple[str, ...]


@dataclass(frozen=True)
class MetricNames:
    """The server's Prometheus families the serving view reads."""

    running: str
    queued: str
    generation_tokens: str  # a counter of generated tokens
    # Advances on every engine step that produced tokens: SGLang's `realtime_tokens_total{mode=
    # "decode"}`; vLLM's `iteration_tokens_total` histogram (its `_count` counts steps). "" if none.
    step_tokens: str
    step_label: tuple[str, str] | None  # a label the step family is filtered on
    requests: str  # finished requests
    throughput: str  # a generation-throughput gauge ("" if none)
    accept_length: str  # a gauge of mean accepted tokens per verify step ("" if counters give it)
    drafts: str  # counters giving acceptance: 1 + accepted / drafts ("" if the gauge gives it)
    accepted_tokens: str
    http_active: str  # the HTTP front's own in-flight gauge ("" if none)
    replica_labels: frozenset[str]  # labels whose series repeat one number (ranks of one batch)
    # Issue 51: the scheduler's admissions, as the `_count` samples of the engine's own histograms: requests
    # that left the queue (SGLang observes queue time on admission; vLLM at the request's end) and requests
    # that got a first token. A request that never starts is in neither ("" if none).
    queue_time_count: str = ""
    first_token_count: str = ""


@dataclass(frozen=True)
class Flags:
    """Command-line flags the daemon reads from a rung's arguments (names without `--`)."""

    speculative: tuple[str, ...]  # any present: the rung speculates
    metrics_on: tuple[str, ...]  # any present: /metrics exists ((): always, unless metrics_off)
    metrics_off: tuple[str, ...]  # any present: no metrics
    model: tuple[str, ...]  # the model's path
    tp_size: tuple[str, ...]
    # Multi-node: how one server of several nodes is told its node (DESIGN, "Where one machine is
    # not enough"); the group daemon supports the engines whose flags are known here.
    nnodes: str
    node_rank: str
    rendezvous: tuple[str, ...]
    # The fraction of each GPU's memory the server takes (the launch-beside-strangers need,
    # supervisor/policy/gpufit.py), and what the engine assumes when it is not given (None: its own
    # choice, not known in advance).
    mem_fraction: str
    mem_fraction_default: float | None


@dataclass(frozen=True)
class EngineProfile:
    name: Engine
    label: str  # how people write it
    default_command: tuple[str, ...]
    log: LogGrammar
    titles: Titles
    metrics: MetricNames
    flags: Flags
    health: HealthStyle
    canary_path: str  # a one-token generation, for engines whose /health is a flag
    canary_body: str  # JSON; token ids, so it works without a tokenizer
    # The engine's own /dev/shm segment names that carry their creator's pid (cleanslate may remove a
    # dead tree's segments only when the name proves whose they were); () where names prove nothing.
    shm_prefixes: tuple[str, ...]
    # check-config's parser: `module:function` building the engine's own argparse parser, when the
    # engine is importable where check-config runs.
    parser: str

    def speculates(self, flags: set[str]) -> bool:
        return any(f in flags for f in self.flags.speculative)

    def has_metrics(self, flags: set[str]) -> bool:
        if any(f in flags for f in self.flags.metrics_off):
            return False
        return not self.flags.metrics_on or any(f in flags for f in self.flags.metrics_on)
