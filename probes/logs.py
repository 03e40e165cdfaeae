"""Incremental parser of SGLang's output: start-up phase, progress bars, errors, decode lines.

SGLang versions print their start-up lines in different orders, so every line is matched as a
pattern, never as a position in a sequence. Every regex here is anchored or bounded, and lines are
cut to `MAX_LINE_CHARS` before matching, so a hostile line costs linear time.

The phase only moves forward. The one stage whose place varies by version is the speculative draft
model: some builds load it right after the target's weights, others after the target's KV cache
and CUDA graphs. Its stages (`loading_draft`, then the draft's own KV cache and graph capture) are
therefore ranked after all of the target's, tracked per rank (`[... TP3]` prefix), so a late line
from a slow rank never drags the phase back and a hang in the draft load is not reported as a
graph-capture hang.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from typing import Literal

from probes.types import DecodeStats, LogLine, LogObservation, Phase, Progress
from supervisor.engines import SGLANG
from supervisor.engines.profile import LogGrammar, Milestone, PrefixStyle

MAX_LINE_CHARS = 8192  # longer lines are matched on their head only
MAX_ERRORS = 20
MAX_ERROR_CHARS = 500
MAX_TRACEBACK_LINES = 2000  # a traceback never spans more; guards against a stuck mode

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
# `[2026-11-29 14:00:00 TP0] `, `[2026-11-29 14:00:00 DP0 TP1] `, with or without milliseconds.
LOG_PREFIX = re.compile(r"\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?P<extra>[^\]]{0,60})\] ?")
_RANK_TAG = re.compile(r"(?:[A-Z]{1,4}\d{1,5})(?: [A-Z]{1,4}\d{1,5}){0,4}")
# tqdm, anchored at the line start: `<label>: <pct>% <anything> <done>/<total> [<times>, <rate>]`
_BAR = re.compile(
    r"\s{0,20}(?P<label>[A-Za-z][^:\r\n]{0,200}):\s{0,10}(?P<pct>\d{1,3})%"
    r"[^/]{0,300}?(?<!\d)(?P<done>\d{1,12})/(?P<total>\d{1,12})(?P<tail>[^\]]{0,120})"
)
_RATE = re.compile(r"(?P<num>\d{1,9}(?:\.\d{1,9})?)(?P<unit>s/[A-Za-z]{1,20}|[A-Za-z]{0,20}/s)")
_LOAD_TYPE = re.compile(r"type=(?P<cls>[A-Za-z0-9_.]{1,200})")
_DRAFT_CLASS_HINTS = ("eagle", "draft", "nextn", "mtp")
_EXCEPTION_LINE = re.compile(r"(?P<name>[A-Za-z_][\w.]{0,200})(?::|$)")
_EXCEPTION_SUFFIXES = ("Error", "Exception", "Interrupt", "Exit", "Failure", "Timeout")

_TRACEBACK = "Traceback (most recent call last):"
# vLLM's records: `(Worker_TP1 pid=7) ` on a child's lines (decorate_logs), then `INFO 12-06 00:10:11
# [core.py:93] ` (vllm/logger.py `_FORMAT`, with an optional VLLM_LOGGING_PREFIX before the level).
_LEVEL_PROC = re.compile(r"\((?P<proc>[A-Za-z][A-Za-z0-9_-]{0,60}) pid=\d{1,10}\) ")
_LEVEL_PREFIX = re.compile(
    r"[^\s]{0,40}?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})? \[[^\]]{0,200}\] ?"
)
_PROC_RANK = re.compile(r"(?:DP|PP|TP|EP)\d{1,5}")

# Ranks along the start-up, in steps of two so that a draft loaded between the target's weights and
# its KV cache (vLLM) fits between them; SGLang's draft stages sort after all the target's (module
# docstring).
_TARGET_RANK: dict[Phase, int] = {
    "spawning": 0,
    "initializing": 2,
    "loading_weights": 4,
    "loading_draft": 5,
    "allocating_kv": 6,
    "capturing_graphs": 8,
}
_Key = tuple[int, int]
_DRAFT_STAGE, _FRONT_STAGE = 1, 2


def _phase_key(phase: Phase, draft: bool, draft_after_target: bool = True) -> _Key:
    if phase == "warming_up":
        return (_FRONT_STAGE, 0)
    if phase == "serving":
        return (_FRONT_STAGE, 1)
    if not draft_after_target:
        return (0, _TARGET_RANK[phase])
    if phase == "loading_draft":
        return (_DRAFT_STAGE, 0)
    if phase in ("allocating_kv", "capturing_graphs") and draft:
        return (_DRAFT_STAGE, _TARGET_RANK[phase])
    return (0, _TARGET_RANK[phase])


def clean(text: str) -> str:
    """The line without ANSI escapes, cut to its last carriage-return segment and MAX_LINE_CHARS."""
    if "\r" in text:
        segments = [s for s in text.split("\r") if s.strip()]
        text = segments[-1] if segments else ""
    text = text[:MAX_LINE_CHARS]
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text


def split_prefix(text: str, style: PrefixStyle = "bracket") -> tuple[str, str]:
    """(`rank tag` such as "TP0" or "DP0 TP1", or "" when none; the message after the prefix)."""
    if style == "level":
        return _split_level(text)
    if not text.startswith("["):
        return "", text
    m = LOG_PREFIX.match(text)
    if m is None:
        return "", text
    tag = m.group("extra").strip()
    rank = _RANK_TAG.search(tag)
    return (rank.group(0) if rank else ""), text[m.end() :]


def _split_level(text: str) -> tuple[str, str]:
    """vLLM: the rank tag from the child's process name (`Worker_TP1` -> "TP1", `EngineCore_DP0` ->
    "DP0"), then the record's level, time and source location dropped."""
    rank = ""
    m = _LEVEL_PROC.match(text)
    if m is not None:
        rank = " ".join(_PROC_RANK.findall(m.group("proc"))[:5])
        text = text[m.end() :]
    lm = _LEVEL_PREFIX.match(text)
    if lm is not None:
        text = text[lm.end() :]
    return rank, text


def parse_progress(message: str) -> Progress | None:
    """A tqdm progress bar such as `Loading safetensors checkpoint shards:  50% Completed | 4/8 [...]`."""
    if "%" not in message or "/" not in message:
        return None
    m = _BAR.match(message)
    if m is None:
        return None
    done, total = int(m.group("done")), int(m.group("total"))
    if total <= 0 or int(m.group("pct")) > 100:
        return None
    label = m.group("label").strip()
    if "(" in label:  # `Capturing batches (bs=160 avail_mem=20.12 GB)`: keep the stable part
        label = label[: label.index("(")].rstrip()
    lowered = label.lower()
    # `Capturing num tokens (...)`: SGLang 0.5.16's piecewise prefill graph, one shape per step.
    graph = "batch" in lowered or lowered.startswith("capturing")
    unit = "shards" if "shard" in lowered else "batches" if graph else "items"
    return Progress(done=done, total=total, unit=unit, label=label, rate=_parse_rate(m.group("tail")))


def _parse_rate(tail: str) -> float | None:
    m = _RATE.search(tail)
    if m is None:
        return None
    value = float(m.group("num"))
    if m.group("unit").startswith("s/"):  # seconds per item
        return 1.0 / value if value > 0 else None
    return value


def parse_decode(message: str, at: float) -> DecodeStats | None:
    """`Decode batch, #running-req: 3, ..., gen throughput (token/s): 123.45, #queue-req: 0,`.

    Fields may come in any order or be missing (a missing count reads 0, a missing rate 0.0);
    None when not a single known field parses.
    """
    idx = message.find("Decode batch")
    if idx < 0:
        return None
    running: int | None = None
    queue: int | None = None
    throughput: float | None = None
    accept: float | None = None
    for part in message[idx + len("Decode batch") :].split(","):
        key, sep, raw = part.partition(":")
        if not sep:
            continue
        key = key.strip(" .;\t").lower()
        try:
            value = float(raw.strip())
        except ValueError:
            continue
        if value != value or value in (float("inf"), float("-inf")):  # NaN, inf
            continue
        if key == "#running-req":
            running = int(value)
        elif key == "#queue-req":
            queue = int(value)
        elif key.startswith("gen throughput"):
            throughput = value
        elif key.startswith("accept len"):
            accept = value
    if running is None and queue is None and throughput is None and accept is None:
        return None
    return DecodeStats(
        at=at,
        running_reqs=running or 0,
        queue_reqs=queue or 0,
        gen_throughput=throughput or 0.0,
        accept_len=accept,
    )


def parse_vllm_stats(message: str, at: float) -> DecodeStats | None:
    """vLLM's `Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 12.3
    tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%, ...` (v1/metrics/loggers.py),
    the role SGLang's `Decode batch` line plays; None when no field parses."""
    idx = message.find("Avg prompt throughput")
    if idx < 0:
        return None
    running: int | None = None
    queue: int | None = None
    throughput: float | None = None
    for part in message[idx:].split(","):
        key, sep, raw = part.partition(":")
        if not sep:
            continue
        number = raw.strip().split(" ", 1)[0].rstrip("%")
        try:
            value = float(number)
        except ValueError:
            continue
        if value != value or value in (float("inf"), float("-inf")):
            continue
        key = key.strip().lower()
        if key == "running":
            running = int(value)
        elif key == "waiting":
            queue = int(value)
        elif key == "avg generation throughput":
            throughput = value
    if running is None and queue is None and throughput is None:
        return None
    return DecodeStats(
        at=at, running_reqs=running or 0, queue_reqs=queue or 0, gen_throughput=throughput or 0.0, accept_len=None
    )


def parse_vllm_accept(message: str) -> float | None:
    """`SpecDecoding metrics: Mean acceptance length: 1.15, ...` (v1/spec_decode/metrics.py)."""
    idx = message.find("Mean acceptance length:")
    if idx < 0:
        return None
    raw = message[idx + len("Mean acceptance length:") :].split(",", 1)[0].strip()
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


class LogParser:
    """Feed it the server's lines as they arrive; `observe()` returns what they add up to so far.

    Never raises on any text. One parser per launch: a relaunch starts a fresh one.
    """

    def __init__(self, grammar: LogGrammar = SGLANG.log, max_errors: int = MAX_ERRORS) -> None:
        self._g = grammar
        self._lines_total = 0
        self._waiting_total = 0
        self._last_line_at: float | None = None
        self._phase: Phase = "spawning"
        self._phase_key: _Key = (0, 0)
        self._progress: Progress | None = None
        self._ready = False
        self._errors: deque[str] = deque(maxlen=max_errors)
        self._decode_total = 0
        self._last_decode: DecodeStats | None = None
        self._health_failed = 0
        self._weights_done: set[str] = set()  # rank tags that printed `Load weight end`
        self._draft_ranks: set[str] = set()  # rank tags loading or past the draft model
        # stream -> (lines so far, rank tag of the record that opened the traceback)
        self._tracebacks: dict[Literal["stdout", "stderr"], tuple[int, str]] = {}

    def feed(self, lines: Iterable[LogLine]) -> None:
        for line in lines:
            self._lines_total += 1
            if self._g.waiting and any(w in line.text for w in self._g.waiting):
                self._waiting_total += 1  # output, not progress
            else:
                self._last_line_at = line.at
            self._feed_one(line)

    def observe(self) -> LogObservation:
        return LogObservation(
            lines_total=self._lines_total,
            last_line_at=self._last_line_at,
            phase=self._phase,
            progress=self._progress,
            ready_line_seen=self._ready,
            errors=tuple(self._errors),
            decode_lines_total=self._decode_total,
            last_decode=self._last_decode,
            health_failed_lines=self._health_failed,
            waiting_lines_total=self._waiting_total,
        )

    def _feed_one(self, line: LogLine) -> None:
        text = clean(line.text)
        if not text.strip():
            return
        g = self._g
        rank, message = split_prefix(text, g.prefix)
        if self._in_traceback(line.stream, rank, message):
            return
        if _TRACEBACK in message:
            self._tracebacks[line.stream] = (0, rank)
        if any(marker in message for marker in g.errors):
            self._add_error(rank, message)
            if g.health_failed and g.health_failed in message:
                self._health_failed += 1
        if g.stats in message:
            self._decode_total += 1
            stats = parse_decode(message, line.at) if g.prefix == "bracket" else parse_vllm_stats(message, line.at)
            if stats is not None:
                self._last_decode = stats
            return
        if g.prefix == "level" and "SpecDecoding metrics" in message:
            accept = parse_vllm_accept(message)
            if accept is not None and self._last_decode is not None:
                self._last_decode = replace(self._last_decode, accept_len=accept)
            return
        self._track_phase(rank, message)
        progress = parse_progress(message)
        if progress is not None:
            if progress.unit == "batches":
                self._advance("capturing_graphs", self._is_draft(rank))
            elif progress.unit == "shards":
                self._advance("loading_weights", False)
            self._progress = progress

    def _in_traceback(self, stream: Literal["stdout", "stderr"], rank: str, message: str) -> bool:
        """Inside a traceback block, swallow its frames and record the exception line ending it."""
        state = self._tracebacks.get(stream)
        if state is None:
            return False
        count, opened_by = state
        if count >= MAX_TRACEBACK_LINES or rank:  # a prefixed line is a new log record
            del self._tracebacks[stream]
            return False
        self._tracebacks[stream] = (count + 1, opened_by)
        if message[:1].isspace() or message.startswith(("During handling", "The above exception")):
            return True
        if _TRACEBACK in message:  # a chained traceback starts over
            return True
        del self._tracebacks[stream]
        m = _EXCEPTION_LINE.match(message)
        if m is not None and m.group("name").endswith(_EXCEPTION_SUFFIXES):
            self._add_error(opened_by, message)
            return True
        return False

    def _add_error(self, rank: str, message: str) -> None:
        text = message.strip()[:MAX_ERROR_CHARS]
        self._errors.append(f"{rank}: {text}" if rank else text)

    def _is_draft(self, rank: str) -> bool:
        return rank in self._draft_ranks if rank else bool(self._draft_ranks)

    def _track_phase(self, rank: str, message: str) -> None:
        if any(r in message for r in self._g.ready):
            self._ready = True
            self._advance("serving", False)
            return
        for text, milestone in self._g.milestones:
            if text in message:
                self._milestone(milestone, rank, message)
                return

    def _milestone(self, milestone: Milestone, rank: str, message: str) -> None:
        if milestone == "weights_begin":
            if rank in self._weights_done:  # a rank's second load is its draft's
                self._draft_ranks.add(rank)
                self._advance("loading_draft", True)
            else:
                self._advance("loading_weights", self._is_draft(rank))
        elif milestone == "weights_end":
            m = _LOAD_TYPE.search(message)
            cls = m.group("cls").lower() if m else ""
            if rank in self._weights_done or any(h in cls for h in _DRAFT_CLASS_HINTS):
                self._draft_ranks.add(rank)
                self._advance("loading_draft", True)
            self._weights_done.add(rank)
        elif milestone == "draft_begin":
            self._draft_ranks.add(rank)
            self._weights_done.add(rank)
            self._advance("loading_draft", True)
        elif milestone == "dist_init":
            self._advance("initializing", False)
        elif milestone in ("kv_begin", "kv_allocated"):
            self._advance("allocating_kv", self._is_draft(rank))
        elif milestone == "draft_graph_begin":
            self._draft_ranks.add(rank)
            self._advance("capturing_graphs", True)
        elif milestone == "graph_begin":
            self._advance("capturing_graphs", self._is_draft(rank))
        elif milestone in ("warmup_begin", "http_up"):
            self._advance("warming_up", False)

    def serving(self) -> None:
        """The daemon judged the server ready (its port, health and, for vLLM, a canary): the phase is
        `serving` even where the engine prints no ready line (vLLM) or printed it before this daemon
        read its log (an adopted server). The ready line itself stays unseen."""
        self._advance("serving", False)

    def _advance(self, phase: Phase, draft: bool) -> None:
        key = _phase_key(phase, draft, self._g.draft_after_target)
        if key > self._phase_key:
            self._phase_key = key
            if phase != self._phase:
                self._progress = None  # a bar belongs to the phase it was drawn in
            self._phase = phase
