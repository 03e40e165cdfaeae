"""A timeline of every launch, the book of good launches, and the outage clock (issue 36).

`Milestones` reads SGLang's own lines as they arrive and notes when each milestone was first seen
(`supervisor.status.launchviews.MILESTONES`); the daemon adds `spawn` and `ready`. `LaunchBook` keeps,
per host, model and rung fingerprint (`supervisor.policy.learned.LaunchKey`), the good starts'
longest quiet interval per phase (what learned windows are made of) and the last good launch's
milestones (what a launch is compared with), in `<state_dir>/launches.json`, written atomically.
`OutageClock` times one outage from the incident to serving again, in its parts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.logs import clean, split_prefix
from probes.types import LogLine
from supervisor.common.atomicfile import atomic_write
from supervisor.common.statefiles import book_entries, read_regular
from supervisor.engines import SGLANG
from supervisor.engines.profile import LogGrammar
from supervisor.engines.profile import Milestone as EngineMilestone
from supervisor.policy.learned import LaunchKey, Learned
from supervisor.status.launchviews import MILESTONES, Milestone, MilestoneView

BOOK_VERSION = 1
# A phase is named in the comparison when it took this much longer than on the last good start,
# by this factor: seconds of jitter on a fast phase are not news.
COMPARE_MIN_EXTRA_S = 5.0
COMPARE_FACTOR = 2.0
_COMPILE_HINTS = (
    "torch.compile", "Compiling", "compile_fx", "autotune", "Autotuning", "inductor", "JIT compil",
    "Dynamo bytecode transform",
)  # fmt: skip


# The engine's start-up milestones (supervisor/engines) as the timeline names them.
_TIMELINE: dict[EngineMilestone, Milestone] = {
    "weights_begin": "weights_loading",
    "weights_end": "weights_loaded",
    "kv_allocated": "kv_allocated",
    "graph_begin": "graph_capture",
    "draft_graph_begin": "graph_capture",
    "warmup_begin": "warmup",
    "http_up": "warmup",
}


def milestone_of(message: str, grammar: LogGrammar = SGLANG.log) -> Milestone | None:
    """The milestone one of the engine's messages shows, if any (the first line that shows one counts)."""
    if any(r in message for r in grammar.ready):
        return "ready_line"
    compiling = any(h in message for h in _COMPILE_HINTS)
    for text, engine_milestone in grammar.milestones:
        if text in message:
            if engine_milestone not in _TIMELINE:  # a milestone of the phases only: never read for hints
                return None  # (vLLM's `Initializing a V1 LLM engine ... with config:` names inductor)
            # vLLM compiles inside the run that sizes its KV cache: the compile is the news there.
            return "compile" if compiling and engine_milestone == "kv_allocated" else _TIMELINE[engine_milestone]
    if message.startswith(("Capturing batches", "Capturing CUDA graphs")):  # the capture's bar
        return "graph_capture"
    if compiling:
        return "compile"
    return None


@dataclass
class Milestones:
    """First-seen times (monotonic) of one launch's milestones."""

    launched_at: float
    seen: dict[str, float] = field(default_factory=dict)
    grammar: LogGrammar = SGLANG.log  # the launch's engine's lines

    def __post_init__(self) -> None:
        self.seen.setdefault("spawn", self.launched_at)

    def feed(self, lines: Iterable[LogLine]) -> None:
        for line in lines:
            text = clean(line.text)
            if not text.strip():
                continue
            _rank, message = split_prefix(text, self.grammar.prefix)
            name = milestone_of(message, self.grammar)
            if name is not None and name not in self.seen:
                self.seen[name] = line.at

    def mark(self, name: Milestone, at: float) -> None:
        self.seen.setdefault(name, at)

    def offsets(self) -> dict[str, float]:
        return {n: round(max(0.0, self.seen[n] - self.launched_at), 3) for n in MILESTONES if n in self.seen}


def views(offsets: Mapping[str, float]) -> tuple[MilestoneView, ...]:
    """Milestones in time order, each with the time until the next one seen."""
    order = sorted(((at, MILESTONES.index(n), n) for n, at in offsets.items() if n in MILESTONES))
    out: list[MilestoneView] = []
    for i, (at, _rank, name) in enumerate(order):
        nxt = order[i + 1][0] if i + 1 < len(order) else None
        phase_s = None if nxt is None else round(nxt - at, 3)
        out.append(MilestoneView(name=name, at_s=at, phase_s=phase_s))
    return tuple(out)


def compare(now: Iterable[MilestoneView], last_good: Iterable[MilestoneView]) -> tuple[str, ...]:
    """Sentences for the phases that took much longer than on the last good start of the same rung."""
    before = {m.name: m.phase_s for m in last_good if m.phase_s is not None}
    out: list[str] = []
    for m in now:
        prev = before.get(m.name)
        if m.phase_s is None or prev is None:
            continue
        if m.phase_s - prev >= COMPARE_MIN_EXTRA_S and m.phase_s >= COMPARE_FACTOR * prev:
            out.append(f"{m.name} took {m.phase_s:.1f} s, the last good start {prev:.1f} s")
    return tuple(out)


@dataclass(frozen=True)
class GoodLaunch:
    offsets: Mapping[str, float]
    time_to_ready_s: float
    wall: float


@dataclass(frozen=True)
class BookEntry:
    key: LaunchKey
    learned: Learned
    last_good: GoodLaunch | None = None


class LaunchBook:
    """`<state_dir>/launches.json`: what good starts taught, per key. A missing, unreadable or foreign
    file is an empty book (a learned window falls back to the configured one, never the reverse)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, BookEntry] = {}
        self.load_error: str | None = None

    def load(self) -> LaunchBook:
        try:
            doc = json.loads(read_regular(self.path))  # no FIFO, link or device (issue 50)
        except FileNotFoundError:
            return self
        except (OSError, ValueError) as err:
            self.load_error = f"{self.path}: {err}"
            return self
        try:
            if doc.get("version") != BOOK_VERSION:
                self.load_error = f"{self.path}: version {doc.get('version')!r}, expected {BOOK_VERSION}"
                return self
            kept, dropped = book_entries(doc.get("entries", {}))  # a NaN or negative number drops its entry
            self.entries.update((k, _entry(e)) for k, e in kept.items())
            self.load_error = f"{self.path}: malformed: " + "; ".join(dropped) if dropped else None
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            self.entries.clear()
            self.load_error = f"{self.path}: malformed ({err!r})"
        return self

    def get(self, key: LaunchKey) -> BookEntry | None:
        return self.entries.get(key.id)

    def put(self, entry: BookEntry) -> None:
        self.entries[entry.key.id] = entry

    def save(self) -> None:
        doc = {"version": BOOK_VERSION, "entries": {k: _doc(e) for k, e in self.entries.items()}}
        # All of it or nothing, and no temporary left on a full disk (supervisor/daemon/persist.py).
        atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())


def _doc(e: BookEntry) -> dict[str, Any]:
    k = e.key
    good = e.last_good
    return {
        "host": k.host,
        "model": k.model,
        "rung": k.rung,
        "fingerprint": k.fingerprint,
        "starts": e.learned.starts,
        "quiet_s": dict(e.learned.quiet_s),
        "last_good": None
        if good is None
        else {"offsets": dict(good.offsets), "time_to_ready_s": good.time_to_ready_s, "wall": good.wall},
    }


def _entry(d: Mapping[str, Any]) -> BookEntry:
    key = LaunchKey(str(d["host"]), str(d["model"]), str(d["rung"]), str(d["fingerprint"]))
    quiet = {str(p): float(q) for p, q in dict(d["quiet_s"]).items()}
    learned = Learned(starts=int(d["starts"]), quiet_s=quiet)
    g = d.get("last_good")
    good = (
        None
        if g is None
        else GoodLaunch(
            {str(n): float(t) for n, t in dict(g["offsets"]).items()}, float(g["time_to_ready_s"]), float(g["wall"])
        )
    )
    return BookEntry(key, learned, good)


@dataclass
class OutageClock:
    """One outage, from the incident (the start of its detection) to serving again. Incidents in a
    row (a relaunch that fails again) extend it: evidence, stop and backoff add up, and every
    relaunch attempt counts in `relaunch`."""

    incident: str | None
    cause: str
    began_at: float  # the first verdict, monotonic
    detection_s: float
    # An operator's restart or promote: its evidence and stop were asked for, not the daemon's choice.
    requested: bool = False
    parts: dict[str, float] = field(default_factory=dict)
    mark: float = 0.0  # the last step's end
    step: str = "evidence"  # what the time since `mark` is counted as

    def __post_init__(self) -> None:
        self.mark = self.began_at
        for part in ("detection", "evidence", "stop_release", "backoff", "relaunch"):
            self.parts.setdefault(part, 0.0)
        self.parts["detection"] = round(max(0.0, self.detection_s), 3)

    def close_step(self, now: float, then: str) -> None:
        """The step under way ends now (its time is added to its part); `then` is counted next."""
        self.parts[self.step] = round(self.parts.get(self.step, 0.0) + max(0.0, now - self.mark), 3)
        self.mark, self.step = now, then

    def began_before(self, seen_s: float) -> None:
        """The first verdict's cause was seen `seen_s` before it (a GPU fault read before the rank
        it killed died): detection counts from there. A later incident of the outage changes nothing."""
        if self.step == "evidence" and self.mark == self.began_at:
            self.detection_s = max(self.detection_s, seen_s)
            self.parts["detection"] = round(max(0.0, self.detection_s), 3)

    def again(self, now: float) -> None:
        """Another incident before serving again: the relaunch attempt ends, evidence begins."""
        self.close_step(now, "evidence")

    @property
    def daemon_s(self) -> float:
        """What the daemon chose: its capture, its stop and its backoff (not a stop the operator asked for)."""
        chosen = self.parts["backoff"]
        if not self.requested:
            chosen += self.parts["evidence"] + self.parts["stop_release"]
        return round(chosen, 3)

    @property
    def total_s(self) -> float:
        return round(sum(self.parts.values()), 3)
