"""The simulator's GPU: an NVML with pynvml's function names and return shapes, read from a JSON file.

The daemon reads it instead of the real NVML when the config says so (`[gpu] source = "simulator"`,
`file = ...`: supervisor/root/gpusource.py); the simulator writes to the same file (a spinning
kernel, supervisor/simulator/gpu/kernel.py), and a test or the demo writes utilisation, memory and
process attribution there while the daemon runs. The file is re-read whenever its mtime, size or
inode changes (checked on `nvmlInit` and on each `nvmlDeviceGetCount`, i.e. once per probe). Write
it atomically (temp file, then rename): a half-written file is ignored and the last good one stays.
A file that is missing or invalid from the start makes `nvmlInit` fail, so the probe reports
`unavailable` with the file's name in the reason. `SimulatedNvml(devices=[...])` builds one in
memory (benchmarks; tests add knobs in tests/support/fake_nvml.py).

The JSON file:

    {
      "init_error": "Driver Not Loaded",      # optional: nvmlInit raises NVMLError with this text
      "devices": [                            # an empty list: no GPUs
        {
          "uuid": "GPU-00000000-0000-0000-0000-000000000000",   # default GPU-fake-<index>
          "name": "NVIDIA H200",                                # default NVIDIA H200
          "util": 35,                         # percent, default 0
          "mem_total": 150754820096,          # bytes, default 143771 MiB
          "mem_used": 1000,                   # bytes, default: the processes' memory summed
          "power_w": 120.5,                   # optional; absent -> the power call says Not Supported
          "power_limit_w": 700,               # optional: the enforced power limit (the power rule's busy end)
          "processes": {"1234": 80000000000, "1235": null},   # compute: pid -> bytes (null: unknown)
          "graphics_processes": {},           # optional, same shape
          "fail": ["nvmlDeviceGetUtilizationRates"],          # optional: calls raising on this GPU
          "gpm": {"sm_util": 0.76, "sm_occupancy": 0.01}      # optional: GPM percent; absent: unsupported
        }
      ],
      "xid_events": [{"gpu": 0, "xid": 79}]   # optional, append-only: Xid events (events.py)
    }
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.simulator.gpu.errors import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NVMLError,
)
from supervisor.simulator.gpu.events import SimulatedEvents
from supervisor.simulator.gpu.gpm import SimulatedGpm, parse_gpm

__all__ = ["H200_BYTES", "Handle", "NVMLError", "SimulatedDevice", "SimulatedNvml"]

H200_BYTES = 143771 * 1024 * 1024

@dataclass(frozen=True)
class Utilization:
    gpu: int
    memory: int = 0


@dataclass(frozen=True)
class Memory:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    usedGpuMemory: int | None  # pynvml's spelling
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(frozen=True)
class Handle:
    index: int


@dataclass
class SimulatedDevice:
    uuid: str = ""
    name: str = "NVIDIA H200"
    util: float = 0.0
    mem_total: int = H200_BYTES
    mem_used: int | None = None  # None: the processes' memory summed
    power_w: float | None = None
    power_limit_w: float | None = None
    processes: dict[int, int | None] = field(default_factory=dict)
    graphics_processes: dict[int, int | None] = field(default_factory=dict)
    fail: set[str] = field(default_factory=set)  # names of calls that raise on this device
    gpm: dict[str, float] | None = None  # GPM percent readings (gpm.py); None: unsupported


class SimulatedNvml(SimulatedEvents, SimulatedGpm):
    """Implements probes.gpu.NvmlLike; every method name and return shape is pynvml's (events:
    SimulatedEvents, GPM: SimulatedGpm)."""

    def __init__(self, devices: Sequence[SimulatedDevice] = (), *, init_error: str | None = None) -> None:
        self.devices: list[SimulatedDevice] = list(devices)
        for i, dev in enumerate(self.devices):
            dev.uuid = dev.uuid or f"GPU-fake-{i}"
        self.init_error = init_error
        self.fail_calls: set[str] = set()  # calls that raise whatever the device
        self.init_calls = 0
        self.shutdown_calls = 0
        self._initialized = 0
        self._lock = threading.Lock()
        self._path: Path | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._file_error = ""

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> SimulatedNvml:
        sim = cls()
        sim._path = Path(path)
        sim._reload()
        return sim

    @property
    def path(self) -> Path | None:
        """The JSON file this NVML reads, or None when built in memory."""
        return self._path

    # -- pynvml's functions ---------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._reload()
        self.init_calls += 1
        self._check("nvmlInit")
        if self._file_error:
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED, self._file_error)
        if self.init_error is not None:
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED, self.init_error)
        self._initialized += 1

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1
        self._require_init()
        self._initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._reload()
        self._require_init()
        self._check("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._require_init()
        if not 0 <= index < len(self.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument")
        self._check("nvmlDeviceGetHandleByIndex", index)
        return Handle(index)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        return self._device(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        return self._device(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Utilization:
        return Utilization(gpu=int(self._device(handle, "nvmlDeviceGetUtilizationRates").util))

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> Memory:
        dev = self._device(handle, "nvmlDeviceGetMemoryInfo")
        used = dev.mem_used
        if used is None:
            used = sum(b or 0 for b in (*dev.processes.values(), *dev.graphics_processes.values()))
        return Memory(total=dev.mem_total, free=max(0, dev.mem_total - used), used=used)

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        dev = self._device(handle, "nvmlDeviceGetPowerUsage")
        if dev.power_w is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        return int(dev.power_w * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:
        dev = self._device(handle, "nvmlDeviceGetEnforcedPowerLimit")
        if dev.power_limit_w is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        return int(dev.power_limit_w * 1000)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:
        dev = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [ProcessInfo(pid=pid, usedGpuMemory=b) for pid, b in dev.processes.items()]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:
        dev = self._device(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return [ProcessInfo(pid=pid, usedGpuMemory=b) for pid, b in dev.graphics_processes.items()]

    # -- internals ------------------------------------------------------------------------------
    def _gpm_device(self, handle: Handle, call: str) -> SimulatedDevice:
        return self._device(handle, call)

    def _gpm_error(self, code: int, text: str) -> Exception:
        return NVMLError(code, text)

    def _require_init(self) -> None:
        if self._initialized <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED, "Uninitialized")

    def _check(self, call: str, gpu: int | None = None) -> None:
        if call in self.fail_calls or (gpu is not None and call in self.devices[gpu].fail):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST, f"{call}: GPU is lost")

    def _device(self, handle: Handle, call: str) -> SimulatedDevice:
        self._require_init()
        if not isinstance(handle, Handle) or not 0 <= handle.index < len(self.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument")
        self._check(call, handle.index)
        return self.devices[handle.index]

    def _reload(self) -> None:
        if self._path is None:
            return
        with self._lock:
            try:
                st = self._path.stat()
                stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
                if stamp == self._stamp:
                    return
                config = _parse_config(json.loads(self._path.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError, KeyError) as err:
                if self._stamp is None:  # nothing good loaded yet: NVML "has no driver"
                    self._file_error = f"simulated GPU file {self._path}: {err}"
                return
            self._stamp = stamp
            self._file_error = ""
            self.init_error, self.devices = config


def _parse_config(data: object) -> tuple[str | None, list[SimulatedDevice]]:
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object with a 'devices' list")
    init_error = data.get("init_error")
    raw_devices = data.get("devices", [])
    if not isinstance(raw_devices, list):
        raise ValueError("'devices' must be a list")
    devices = []
    for i, raw in enumerate(raw_devices):
        if not isinstance(raw, dict):
            raise ValueError(f"devices[{i}] must be an object")
        power = raw.get("power_w")
        mem_used = raw.get("mem_used")
        devices.append(
            SimulatedDevice(
                uuid=str(raw.get("uuid") or f"GPU-fake-{i}"),
                name=str(raw.get("name", "NVIDIA H200")),
                util=float(raw.get("util", 0.0)),
                mem_total=int(raw.get("mem_total", H200_BYTES)),
                mem_used=None if mem_used is None else int(mem_used),
                power_w=None if power is None else float(power),
                power_limit_w=None if raw.get("power_limit_w") is None else float(raw["power_limit_w"]),
                processes=_pid_map(raw.get("processes", {})),
                graphics_processes=_pid_map(raw.get("graphics_processes", {})),
                fail={str(call) for call in raw.get("fail", [])},
                gpm=parse_gpm(raw.get("gpm")),
            )
        )
    return (None if init_error is None else str(init_error)), devices


def _pid_map(raw: object) -> dict[int, int | None]:
    if not isinstance(raw, dict):
        raise ValueError("processes must be an object of pid -> bytes")
    return {int(pid): None if used is None else int(used) for pid, used in raw.items()}
