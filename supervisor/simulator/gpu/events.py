"""NVML's event API for the simulated GPU (nvml.py): Xid critical errors driven by the same JSON
file, so a test (or the demo) can raise an Xid on a running daemon.

The file gains a top-level list, append-only:

    "xid_events": [{"gpu": 0, "xid": 79}, {"gpu": 1, "xid": 13}]

Each entry is delivered once, in order, to every event set that registered that GPU for
Xid critical errors; `nvmlEventSetWait` raises NVML_ERROR_TIMEOUT after its timeout when there is
nothing new, as the real call does.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.simulator.gpu.errors import NVMLError

NVML_ERROR_TIMEOUT = 10  # not an error the other calls raise: nvmlEventSetWait's own
EVENT_XID_CRITICAL = 0x8


@dataclass(frozen=True)
class EventData:
    device: Any  # the registered handle, as pynvml gives it
    eventType: int  # pynvml's spelling
    eventData: int  # the Xid
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class EventSet:
    handles: dict[int, Any] = field(default_factory=dict)  # gpu index -> handle
    delivered: int = 0  # entries of xid_events already seen by this set


class SimulatedEvents:
    """Mixed into SimulatedNvml, which provides `_path`, `_device` and the devices."""

    _path: Path | None
    _xid_lock = threading.Lock()

    def nvmlEventSetCreate(self) -> EventSet:
        return EventSet()

    def nvmlEventSetFree(self, event_set: EventSet) -> None:
        event_set.handles.clear()

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: EventSet) -> None:
        self._device(handle, "nvmlDeviceRegisterEvents")  # type: ignore[attr-defined]
        if event_types & EVENT_XID_CRITICAL:
            event_set.handles[handle.index] = handle

    def nvmlEventSetWait(self, event_set: EventSet, timeout_ms: int) -> EventData:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            events = self._xid_events()
            with self._xid_lock:
                while event_set.delivered < len(events):
                    gpu, xid = events[event_set.delivered]
                    event_set.delivered += 1
                    if gpu in event_set.handles:
                        return EventData(event_set.handles[gpu], EVENT_XID_CRITICAL, xid)
            left = deadline - time.monotonic()
            if left <= 0:
                raise NVMLError(NVML_ERROR_TIMEOUT, "Timeout")
            time.sleep(min(0.05, left))

    def nvmlEventSetWait_v2(self, event_set: EventSet, timeout_ms: int) -> EventData:
        return self.nvmlEventSetWait(event_set, timeout_ms)

    def _xid_events(self) -> list[tuple[int, int]]:
        """The file's `xid_events`; a file being rewritten or malformed reads as no new events."""
        extra = self._queued_xids()
        if self._path is None:
            return extra
        try:
            raw = json.loads(self._path.read_text(encoding="utf-8")).get("xid_events", [])
            return [(int(e["gpu"]), int(e["xid"])) for e in raw] + extra
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return extra

    def _queued_xids(self) -> list[tuple[int, int]]:
        """Xid events raised in memory rather than through the file (none here; a subclass may add some)."""
        return []
