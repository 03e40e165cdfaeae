"""Learned start-up stall windows (issue 36): pure decisions, no I/O.

The daemon keeps, per host, model and rung fingerprint, the longest quiet interval of each start-up
phase seen on good starts (a start that reached `ready`). A phase's window is `multiple` x that,
at least `floor_s`, at most the configured `startup_stall_s` (the ceiling). An unknown model, a
changed rung (its rendered command line) or another host has no entry: the configured window holds.
NVIDIA resiliency-ext learns its hang timeouts the same way (about 5 x the longest interval seen).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from supervisor.config.fast import LearnedSettings

WindowSource = Literal["configured", "learned", "floor", "off"]


@dataclass(frozen=True)
class LaunchKey:
    """What a learned window is learned for: the host, the model, the rung and its command line."""

    host: str
    model: str
    rung: str
    fingerprint: str  # of the rendered argv (fingerprint())

    @property
    def id(self) -> str:
        return f"{self.host}|{self.model}|{self.rung}|{self.fingerprint}"


@dataclass(frozen=True)
class Learned:
    """Good starts of one key: how many, and each phase's longest quiet interval (seconds)."""

    starts: int = 0
    quiet_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Window:
    """The start-up stall window in force for one phase, and why (for /status and check-config)."""

    phase: str
    window_s: float
    source: WindowSource
    why: str
    learned_quiet_s: float | None = None


# Where the server listens changes neither what it loads nor what it compiles.
_NOT_FINGERPRINTED = ("--host", "--port")


def fingerprint(argv: Sequence[str]) -> str:
    """A short stable digest of the rung's rendered command line, without --host and --port: another
    flag or value is another rung (the environment is not part of it: docs/DECISIONS.md, issue 36)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _NOT_FINGERPRINTED:
            skip = True
            continue
        if arg.startswith(tuple(f + "=" for f in _NOT_FINGERPRINTED)):
            continue
        kept.append(arg)
    return hashlib.sha256("\0".join(kept).encode("utf-8", "replace")).hexdigest()[:16]


def model_of(argv: Sequence[str]) -> str:
    """The model the command line serves (`--model-path` or `--model`), or "" when it names none."""
    for i, arg in enumerate(argv):
        for flag in ("--model-path", "--model"):
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return ""


def window_for(learned: Learned | None, phase: str, configured_s: float, s: LearnedSettings) -> Window:
    """The window for `phase`: learned where this key has enough good starts and the phase was seen
    on them; else the configured one. Never above the configured window, never below the floor."""
    if not s.enabled:
        return Window(phase, configured_s, "off", "learned windows are off ([learned] enabled = false)")
    if learned is None or learned.starts == 0:
        why = "no good start of this model and rung on this host yet: the configured window"
        return Window(phase, configured_s, "configured", why)
    if learned.starts < s.min_starts:
        why = f"{learned.starts} good start(s) of this model and rung, fewer than min_starts = {s.min_starts}"
        return Window(phase, configured_s, "configured", why)
    quiet = learned.quiet_s.get(phase)
    if quiet is None:
        why = f"phase {phase} was never seen on a good start of this model and rung: the configured window"
        return Window(phase, configured_s, "configured", why)
    if not math.isfinite(quiet) or quiet < 0:  # NaN compares false both ways: it would turn the window off
        why = f"the learned quiet {quiet!r} s in {phase} is not a number of seconds: the configured window"
        return Window(phase, configured_s, "configured", why)
    raw = s.multiple * quiet
    floor = min(s.floor_s, configured_s)
    if raw >= configured_s:
        why = f"{s.multiple:g} x the longest quiet {quiet:.1f} s in {phase} is over the configured window"
        return Window(phase, configured_s, "configured", why, quiet)
    if raw <= floor:
        why = (
            f"{s.multiple:g} x the longest quiet {quiet:.1f} s in {phase} on {learned.starts} good start(s) "
            f"is under the floor {floor:g} s"
        )
        return Window(phase, floor, "floor", why, quiet)
    why = f"{s.multiple:g} x the longest quiet {quiet:.1f} s in {phase} on {learned.starts} good start(s)"
    return Window(phase, raw, "learned", why, quiet)


def learn(previous: Learned | None, quiet_s: Mapping[str, float]) -> Learned:
    """One more good start: each phase keeps the longest quiet interval ever seen in it."""
    before = previous or Learned()
    merged = dict(before.quiet_s)
    for phase, q in quiet_s.items():
        if q >= 0 and q == q:  # not NaN
            merged[phase] = max(merged.get(phase, 0.0), float(q))
    return Learned(starts=before.starts + 1, quiet_s=merged)


def fold_quiet(longest: Mapping[str, float], phase: str, quiet_s: float) -> dict[str, float]:
    """A poll's quiet time (since the last strong progress) folded into the launch's longest per phase."""
    out = dict(longest)
    if quiet_s >= 0:
        out[phase] = max(out.get(phase, 0.0), quiet_s)
    return out
