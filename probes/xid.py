"""GPU faults (Xid) as NVML reports them: a background thread blocked in `nvmlEventSetWait` with
a short timeout, so the event loop never waits on the driver. The probe observes and never decides:
what an Xid means for the server is supervisor.policy.xidpolicy's business.

NVML's event API, as pynvml spells it: `nvmlEventSetCreate()`, `nvmlDeviceRegisterEvents(handle,
nvmlEventTypeXidCriticalError, set)`, `nvmlEventSetWait(set, timeout_ms)` -> data with `device`
(a handle), `eventType` and `eventData` (the Xid number); a wait with nothing to report raises
NVMLError with NVML_ERROR_TIMEOUT.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

EVENT_XID_CRITICAL = 0x0000000000000008  # nvmlEventTypeXidCriticalError
NVML_ERROR_TIMEOUT = 10
WAIT_MS = 500  # one wait; the thread checks for stop between waits
RETRY_S = 30.0  # after NVML failed (no driver, no events support), try again this much later
_MAX_QUEUED = 1000  # an Xid storm must not grow memory: the oldest are dropped, and counted

XidStatus = Literal["starting", "watching", "unavailable"]


@dataclass(frozen=True)
class XidEvent:
    gpu: int  # NVML index
    uuid: str
    xid: int
    at: float  # wall clock when the daemon read it


def _text(v: object) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


class XidWatcher:
    """Registers every GPU for Xid critical errors and queues what NVML reports; `drain` hands the
    queue to the supervisor loop. `nvml` is pynvml or a fake with the same names."""

    def __init__(
        self,
        nvml: Any,
        *,
        wall: Callable[[], float] = time.time,
        wait_ms: int = WAIT_MS,
        retry_s: float = RETRY_S,
    ) -> None:
        self._nvml = nvml
        self._wall = wall
        self._wait_ms = wait_ms
        self._retry_s = retry_s
        self._queue: deque[XidEvent] = deque(maxlen=_MAX_QUEUED)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.status: XidStatus = "starting" if nvml is not None else "unavailable"
        self.reason = "" if nvml is not None else "NVML is not available"
        self.gpus: tuple[int, ...] = ()  # registered
        self.refused: tuple[str, ...] = ()  # GPUs that would not register, and why

    def start(self) -> None:
        if self._nvml is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def drain(self) -> list[XidEvent]:
        with self._lock:
            out = list(self._queue)
            self._queue.clear()
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                event_set, by_uuid = self._register()
            except Exception as err:  # no driver, no event support, a GPU lost: say so, retry later
                self.status, self.reason = "unavailable", f"cannot watch Xid events: {str(err)[:200]}"
                with contextlib.suppress(Exception):
                    self._nvml.nvmlShutdown()
                self._stop.wait(self._retry_s)
                continue
            self.status, self.reason = "watching", ""
            try:
                self._watch(event_set, by_uuid)
            except Exception as err:
                self.status, self.reason = "unavailable", f"Xid event wait failed: {str(err)[:200]}"
                self._stop.wait(self._retry_s)
            finally:
                try:
                    self._nvml.nvmlEventSetFree(event_set)
                    self._nvml.nvmlShutdown()
                except Exception:
                    pass

    def _register(self) -> tuple[Any, dict[str, int]]:
        nvml = self._nvml
        nvml.nvmlInit()
        event_set = nvml.nvmlEventSetCreate()
        by_uuid: dict[str, int] = {}
        refused: list[str] = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            try:  # a GPU that refuses (lost, or events not supported) must not blind the others
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, EVENT_XID_CRITICAL, event_set)
                by_uuid[_text(nvml.nvmlDeviceGetUUID(handle))] = index
            except Exception as err:
                refused.append(f"GPU {index}: {str(err)[:100]}")
        if not by_uuid:
            nvml.nvmlEventSetFree(event_set)
            raise RuntimeError("no GPU accepted Xid events: " + ("; ".join(refused) or "no GPU"))
        self.gpus = tuple(sorted(by_uuid.values()))
        self.refused = tuple(refused)
        return event_set, by_uuid

    def _watch(self, event_set: Any, by_uuid: dict[str, int]) -> None:
        nvml = self._nvml
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait(event_set, self._wait_ms)
            except Exception as err:
                if getattr(err, "value", None) == NVML_ERROR_TIMEOUT:
                    continue
                raise
            if not int(getattr(data, "eventType", 0)) & EVENT_XID_CRITICAL:
                continue
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except Exception:  # the GPU fell off the bus: its handle no longer answers
                uuid = ""
            event = XidEvent(by_uuid.get(uuid, -1), uuid, int(data.eventData), self._wall())
            with self._lock:
                self._queue.append(event)
