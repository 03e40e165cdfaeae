"""GPU probe through NVML: per-GPU utilisation and memory, and GPU memory held by given pids.

Blocking (NVML calls can take milliseconds per GPU, and longer on a GPU in trouble): the daemon
calls it through `asyncio.to_thread`. It never raises: without pynvml, without a driver or without a
GPU the observation says `unavailable` with the reason; a call that fails on one device degrades
that one field (utilisation and memory read 0, power None, a process list empty).

NVML reports host pids. In a container without the host pid namespace, attribution to the tree
finds nothing; the per-GPU numbers are still right.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, TypeVar, cast

from probes.gpuscope import DeviceScope
from probes.types import GpuDevice, GpuObservation, GpuProcess

INIT_RETRY_S = 60.0  # a failed nvmlInit is retried no more often: it can take seconds per attempt
_NOT_AVAILABLE = 2**63  # older pynvml passes NVML_VALUE_NOT_AVAILABLE (2**64 - 1) through

T = TypeVar("T")


class UtilizationLike(Protocol):
    @property
    def gpu(self) -> int: ...


class MemoryLike(Protocol):
    @property
    def used(self) -> int: ...

    @property
    def total(self) -> int: ...


class ProcessLike(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def usedGpuMemory(self) -> int | None: ...  # pynvml's spelling


class NvmlLike(Protocol):
    """The few pynvml functions the probe uses; the pynvml module itself and the simulator's GPU
    (supervisor/simulator/gpu) satisfy it."""

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> UtilizationLike: ...

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> MemoryLike: ...

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...  # milliwatts
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...  # milliwatts

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[ProcessLike]: ...

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> Sequence[ProcessLike]: ...


def load_pynvml() -> NvmlLike | None:
    """The pynvml module, or None where it is not installed (GpuProbe then reports `unavailable`).
    Which NVML the daemon reads is the composition root's choice (supervisor/root/gpusource.py)."""
    try:
        import pynvml
    except Exception:  # ImportError, or a broken install failing on import
        return None
    return cast(NvmlLike, pynvml)


def describe_error(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text[:200]


def _attempt(call: Callable[[], T], default: T) -> T:
    try:
        return call()
    except Exception:
        return default


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _bytes(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= _NOT_AVAILABLE:
        return 0
    return value


class GpuProbe:
    """Reads NVML; `nvml=None` imports pynvml here (never at module import) or reports unavailable."""

    def __init__(
        self,
        nvml: NvmlLike | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        init_retry_s: float = INIT_RETRY_S,
        scope: DeviceScope | None = None,
    ) -> None:
        self.scope = scope or DeviceScope()  # the server's GPUs (CUDA_VISIBLE_DEVICES); others are not read
        self._monotonic = monotonic
        self._init_retry_s = init_retry_s
        self._lock = threading.Lock()
        self._initialized = False
        self._failed_at: float | None = None  # when nvmlInit last failed
        self._reason = ""
        self._nvml: NvmlLike | None = nvml
        if nvml is None:
            try:
                import pynvml
            except Exception as err:  # ImportError, or a broken install failing on import
                self._reason = f"pynvml is not installed ({describe_error(err)})"
            else:
                self._nvml = cast(NvmlLike, pynvml)

    @property
    def nvml(self) -> NvmlLike | None:
        """The NVML object this probe reads (the GPM probe samples through the same one)."""
        return self._nvml

    def observe(self, tree_pids: Collection[int], *, scoped: bool = True) -> GpuObservation:
        """The server's GPUs (every GPU with `scoped=False`), and the processes among `tree_pids`
        holding GPU memory on them."""
        return self._collect(frozenset(tree_pids), scoped=scoped)

    def snapshot_all(self) -> GpuObservation:
        """All the server's GPUs and every process NVML lists on them, for diagnostic bundles."""
        return self._collect(None)

    def held_by(self, pids: Collection[int]) -> dict[int, int]:
        """pid -> GPU bytes (summed over GPUs) for each of `pids` that NVML still lists on a GPU.

        A pid listed with unknown memory maps to 0: it still holds a context. Empty when NVML is
        unavailable, so a caller that must tell "released" from "cannot tell" checks
        `snapshot_all().status` too.
        """
        held: dict[int, int] = {}
        # Every GPU, not only the scope's: a process of the tree holds memory wherever it is.
        for proc in self._collect(frozenset(pids), scoped=False).processes:
            held[proc.pid] = held.get(proc.pid, 0) + proc.used_bytes
        return held

    def close(self) -> None:
        with self._lock:
            if self._initialized and self._nvml is not None:
                _attempt(self._nvml.nvmlShutdown, None)
            self._initialized = False

    def _ensure_init(self) -> str:
        """Empty once NVML is initialised, else why not; a failed init is retried every init_retry_s."""
        with self._lock:
            if self._nvml is None:
                return self._reason
            if self._initialized:
                return ""
            now = self._monotonic()
            if self._failed_at is not None and now - self._failed_at < self._init_retry_s:
                return self._reason
            try:
                self._nvml.nvmlInit()
            except Exception as err:
                self._failed_at = now
                self._reason = f"nvmlInit failed: {describe_error(err)}"
                return self._reason
            self._initialized = True
            self._failed_at = None
            self._reason = ""
            return ""

    def _collect(self, pids: frozenset[int] | None, *, scoped: bool = True) -> GpuObservation:
        reason = self._ensure_init()
        nvml = self._nvml
        if reason or nvml is None:
            return GpuObservation(status="unavailable", reason=reason or "NVML not initialised")
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as err:
            return GpuObservation(status="unavailable", reason=f"nvmlDeviceGetCount failed: {describe_error(err)}")
        if count <= 0:
            return GpuObservation(status="unavailable", reason="no NVIDIA GPU found")
        devices: list[GpuDevice] = []
        processes: list[GpuProcess] = []
        for index in range(count):
            if scoped and not self.scope.everything and index not in self.scope.indices and not self.scope.uuids:
                continue  # out of scope by index alone: not even a handle
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception:
                continue  # a GPU fallen off the bus: the others still count
            device = _read_device(nvml, index, handle)
            if scoped and not self.scope.matches(index, device.uuid):
                continue
            devices.append(device)
            processes.extend(_read_processes(nvml, device, handle, pids))
        if not devices and scoped and not self.scope.everything:
            return GpuObservation(status="unavailable", reason=f"none of {count} GPUs is in {self.scope.describe()}")
        if not devices:
            return GpuObservation(status="unavailable", reason=f"none of {count} GPU handles could be read")
        return GpuObservation(status="ok", reason="", devices=tuple(devices), processes=tuple(processes))


def _read_device(nvml: NvmlLike, index: int, handle: Any) -> GpuDevice:
    used, total = _attempt(lambda: _memory(nvml, handle), (0, 0))
    util: float | None = _attempt(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu), None)
    return GpuDevice(
        index=index,
        uuid=_attempt(lambda: _text(nvml.nvmlDeviceGetUUID(handle)), ""),
        name=_attempt(lambda: _text(nvml.nvmlDeviceGetName(handle)), ""),
        util_percent=0.0 if util is None else util,
        mem_used_bytes=used,
        mem_total_bytes=total,
        power_w=_attempt(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, None),
        power_limit_w=_attempt(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0, None),
        util_read=util is not None,
    )


def _memory(nvml: NvmlLike, handle: Any) -> tuple[int, int]:
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return _bytes(info.used), _bytes(info.total)


def _read_processes(nvml: NvmlLike, device: GpuDevice, handle: Any, pids: frozenset[int] | None) -> list[GpuProcess]:
    """Compute and graphics contexts on one GPU; a pid in both lists counts once (the larger)."""
    used: dict[int, int] = {}
    for listing in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
        try:
            procs = list(listing(handle))
        except Exception:
            continue  # not supported on this GPU, or failed: the other listing may still answer
        for proc in procs:
            try:
                pid, size = int(proc.pid), _bytes(proc.usedGpuMemory)
            except Exception:
                continue
            if pids is None or pid in pids:
                used[pid] = max(used.get(pid, 0), size)
    return [GpuProcess(pid=pid, gpu_index=device.index, uuid=device.uuid, used_bytes=b) for pid, b in used.items()]
