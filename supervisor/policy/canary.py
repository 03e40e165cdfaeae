"""When the daemon's canary generation goes with a health check (engines whose /health is a flag: vLLM).

While the server starts, every health check carries it: ready is a generation answered. While it
serves with requests in flight, never: token progress judges the engine (the serving-stall rule), and
a canary queued behind the requests would time out on a busy server that is fine. While it serves
idle (or its gauges cannot say), at most once a serving window (issue 51): an idle server is not
kept busy by its watcher, and a wedge /health does not see is still found within a window. A canary
that failed (or a health check that failed before it could go) is repeated at every health check
until one answers, so the failures run in a row and the unhealthy rule can count them.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from probes.types import ServingObservation


@dataclass(frozen=True)
class CanaryState:
    at: float | None = None  # when the last canary went (with its health check)
    ok: bool = False  # whether that health check and its canary answered


def busy(sv: ServingObservation | None) -> bool:
    """Requests in flight by the server's own gauges."""
    return sv is not None and sv.available and (sv.running_reqs or 0) + (sv.queue_reqs or 0) > 0


def wants_canary(
    flag_health: bool, serving: bool, sv: ServingObservation | None, last: CanaryState, now: float, window_s: float
) -> bool:
    """Whether the next health check carries the canary."""
    if not flag_health:
        return False
    if not serving:
        return True
    if busy(sv):
        return False
    if last.at is None or not last.ok:
        return True
    return now - last.at >= window_s


def sent(last: CanaryState, now: float) -> CanaryState:
    return CanaryState(at=now, ok=last.ok)


def answered(last: CanaryState, ok: bool) -> CanaryState:
    return CanaryState(at=last.at, ok=ok)
