"""The JSON shapes of issue 36 in `GET /status`: `launch_timeline` (the current or last launch's
milestones, compared with the last good launch of the same rung), `stall_window` (the start-up
window in force and why) and `last_outage` (incident to serving again, with its parts)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

# The milestones of one launch, in the order SGLang reaches them. Each is seen from SGLang's own
# lines (the first line that shows it) or, for `spawn` and `ready`, from the daemon.
Milestone = Literal[
    "spawn",  # the daemon spawned the command
    "weights_loading",  # `Load weight begin`
    "weights_loaded",  # `Load weight end` (the target model's)
    "kv_allocated",  # `KV Cache is allocated` / `Memory pool end`
    "graph_capture",  # the first `Capture ... CUDA graph begin` or `Capturing batches`
    "compile",  # the first line of torch.compile / inductor / autotuning, when any
    "warmup",  # `Uvicorn running on` / `Application startup complete`: the warm-up request goes out
    "ready_line",  # `The server is fired up and ready to roll`: the warm-up request answered
    "ready",  # the daemon's verdict: port bound by the tree and health answered
]
MILESTONES: tuple[Milestone, ...] = (
    "spawn",
    "weights_loading",
    "weights_loaded",
    "kv_allocated",
    "graph_capture",
    "compile",
    "warmup",
    "ready_line",
    "ready",
)
CacheState = Literal["hit", "miss", "set_aside", "unpinned"]
OutagePart = Literal["detection", "evidence", "stop_release", "backoff", "relaunch"]
OUTAGE_PARTS: tuple[OutagePart, ...] = ("detection", "evidence", "stop_release", "backoff", "relaunch")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MilestoneView(_Frozen):
    name: Milestone
    at_s: float  # seconds since the spawn
    phase_s: float | None = None  # until the next milestone seen (None: the last one so far)


class CacheView(_Frozen):
    """The kernel caches of this launch (supervisor/warmstart/kernelcache.py)."""

    dir: str  # the fingerprint's directory under [paths] cache_dir ("" when not pinned)
    state: CacheState
    bytes_before: int = 0
    bytes_after: int | None = None  # once ready
    pinned: tuple[str, ...] = ()  # the variables the daemon set
    operator_set: tuple[str, ...] = ()  # the variables the operator set (left alone)
    set_aside: str | None = None  # where a cache a crashed launch may have corrupted was moved
    # issue 50: fingerprints in the same cache_dir that other daemons own (never touched), their bytes
    others: int = 0
    others_bytes: int = 0
    refused: str | None = None  # why the caches are unpinned: a cache_dir or a link not safe to use


class ResidencyView(_Frozen):
    """How much of the model's weight files the page cache held before this launch."""

    files: int
    bytes: int
    resident_bytes: int
    fraction: float
    readahead: bool
    error: str | None = None


class LaunchTimelineView(_Frozen):
    rung: str
    model: str
    fingerprint: str
    started_at: str | None = None
    milestones: tuple[MilestoneView, ...] = ()
    time_to_ready_s: float | None = None
    longest_quiet_s: dict[str, float] = {}  # per watchdog phase, the longest quiet interval so far
    last_good: tuple[MilestoneView, ...] = ()  # the last good launch of the same rung, same key
    last_good_time_to_ready_s: float | None = None
    compared: tuple[str, ...] = ()  # e.g. "warmup took 119.0 s, the last good start 2.0 s"
    cache: CacheView | None = None
    residency: ResidencyView | None = None


class StallWindowView(_Frozen):
    phase: str
    window_s: float
    source: Literal["configured", "learned", "floor", "off"]
    why: str
    configured_s: float
    learned_quiet_s: float | None = None


class OutageView(_Frozen):
    incident: str | None = None
    cause: str
    total_s: float | None = None  # incident (the start of detection) to serving again; None while under way
    parts: dict[str, float] = {}  # detection, evidence, stop_release, backoff, relaunch
    daemon_s: float | None = None  # what the daemon chose: its capture, its stop, its backoff
    rung: str | None = None
    # The incident that took over before serving again (a hang in the relaunch of an operator's
    # restart is an outage of its own); None: it ended serving.
    ended_by: str | None = None
