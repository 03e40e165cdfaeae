"""The current server's start-up, sampled from the published snapshots, for the status page's chart.

Kept in memory only (the page shows the launch now running or just finished). A new launch (a new
`started_at`) starts a new timeline; points are taken while the server is starting, then one more
when it leaves `starting`, at most one per `min_gap_s`; past `max_points` every other point is
dropped, so a 25-minute load stays whole at a coarser grain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from supervisor.status.snapshot import StatusSnapshot


@dataclass(frozen=True)
class TimelinePoint:
    t_s: float  # seconds since the timeline began (the first snapshot of the launch)
    state: str
    fraction: float | None  # start-up progress 0..1 where the log shows a bar
    gpu_mem_bytes: int  # held by the server's tree
    channels: tuple[str, ...]  # progress channels that moved around this point


class Timeline:
    def __init__(self, monotonic: Callable[[], float], *, max_points: int = 600, min_gap_s: float = 0.5) -> None:
        self._monotonic = monotonic
        self._max = max(4, max_points)
        self._gap = min_gap_s
        self._launch: str | None = None
        self._t0 = 0.0
        self._points: list[TimelinePoint] = []
        self._closed = False

    def feed(self, snap: StatusSnapshot) -> None:
        """Called on every publish; cheap when there is nothing to record."""
        now = self._monotonic()
        if snap.started_at is not None and snap.started_at != self._launch and snap.state == "starting":
            self._launch, self._t0, self._points, self._closed = snap.started_at, now, [], False
        if self._launch is None or self._closed or snap.started_at != self._launch:
            return
        leaving = snap.state != "starting"
        if not leaving and self._points and now - self._t0 - self._points[-1].t_s < self._gap:
            return
        self._points.append(
            TimelinePoint(
                t_s=round(now - self._t0, 3),
                state=snap.state,
                fraction=snap.progress.fraction if snap.progress is not None else None,
                gpu_mem_bytes=snap.gpu.tree_mem_bytes,
                channels=snap.channels_moved,
            )
        )
        self._closed = leaving
        if len(self._points) > self._max:
            self._points = [*self._points[:-1:2], self._points[-1]]  # the newest always stays

    def points(self) -> tuple[TimelinePoint, ...]:
        return tuple(self._points)
