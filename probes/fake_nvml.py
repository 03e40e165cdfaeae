"""An in-memory NVML with pynvml's function names and return shapes, for tests and CI.

Configured in code (`FakeNvml(devices=[FakeDevice(...)])`, then `set_process`, `set_util`, ...) or
from a JSON file: when the environment variable `SGLANG_SUPERVISOR_FAKE_NVML` names a file,
`make_nvml` (defined in probes.gpu, re-exported here) returns `FakeNvml.from_file(path)`, which
re-reads the file whenever its mtime, size or inode changes (checked on `nvmlInit` and on each
`nvmlDeviceGetCount`, i.e. once per probe), so a test can change utilisation, memory and process
attribution while the daemon runs. Write the file atomically (temp file, then rename): a
half-written file is ignored and the last good one stays. A file that is missing or invalid from
the start makes `nvmlInit` fail, so the probe reports `unavailable` with the file's name in the
reason.

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
          "processes": {"1234": 80000000000, "1235": null},   # compute: pid -> bytes (null: unknown)
          "graphics_processes": {},           # optional, same shape
          "fail": ["nvmlDeviceGetUtilizationRates"],          # optional: calls raising on this GPU
          "gpm": {"sm_util": 0.76, "sm_occupancy": 0.01}      # optional: GPM percent; absent: unsupported
        }
      ],
      "xid_events": [{"gpu": 0, "xid": 79}]   # optional, append-only: Xid events (probes/fake_nvml_events.py)
    }
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from probes.fake_gpm import FakeGpm, parse_gpm
from probes.fake_nvml_events import FakeNvmlEvents
from probes.gpu import FAKE_NVML_ENV, make_nvml

__all__ = ["FAKE_NVML_ENV", "FakeDevice", "FakeNvml", "NVMLError", "make_nvml"]

H200_BYTES = 143771 * 1024 * 1024

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15


class NVMLError(Exception):
    """Shaped like pynvml.NVMLError: `value` is the NVML return code."""

    def __init__(self, value: int, message: str = "") -> None:
        super().__init__(message or f"NVML error {value}")
        self.value = value


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
class FakeDevice:
    uuid: str = ""
    name: str = "NVIDIA H200"
    util: float = 0.0
    mem_total: int = H200_BYTES
    mem_used: int | None = None  # None: the processes' memory summed
    power_w: float | None = None
    processes: dict[int, int | None] = field(default_factory=dict)
    graphics_processes: dict[int, int | None] = field(default_factory=dict)
    fail: set[str] = field(default_factory=set)  # names of calls that raise on this device
    gpm: dict[str, float] | None = None  # GPM percent readings (probes/fake_gpm.py); None: unsupported


class FakeNvml(FakeNvmlEvents, FakeGpm):
    """Implements NvmlLike; every method name and return shape is pynvml's (events: FakeNvmlEvents, GPM: FakeGpm)."""

    def __init__(self, devices: Sequence[FakeDevice] = (), *, init_error: str | None = None) -> None:
        self.devices: list[FakeDevice] = list(devices)
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
        self.xid_queue: list[tuple[int, int]] = []

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> FakeNvml:
        fake = cls()
        fake._path = Path(path)
        fake._reload()
        return fake

    # -- configuration, for tests ---------------------------------------------------------------
    def set_process(self, gpu: int, pid: int, used_bytes: int | None) -> None:
        self.devices[gpu].processes[pid] = used_bytes

    def remove_process(self, gpu: int, pid: int) -> None:
        self.devices[gpu].processes.pop(pid, None)
        self.devices[gpu].graphics_processes.pop(pid, None)

    def set_util(self, gpu: int, percent: float) -> None:
        self.devices[gpu].util = percent

    def set_memory(self, gpu: int, used: int | None) -> None:
        self.devices[gpu].mem_used = used

    def fail(self, call: str, gpu: int | None = None) -> None:
        """Make `call` raise NVMLError, on one GPU or (gpu=None) everywhere, until `heal`."""
        if gpu is None:
            self.fail_calls.add(call)
        else:
            self.devices[gpu].fail.add(call)

    def raise_xid(self, gpu: int, xid: int) -> None:
        """Queue an Xid critical error on `gpu` for the event sets (as the file's `xid_events` do)."""
        self.xid_queue.append((gpu, xid))

    def heal(self) -> None:
        self.fail_calls.clear()
        for dev in self.devices:
            dev.fail.clear()

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

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:
        dev = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [ProcessInfo(pid=pid, usedGpuMemory=b) for pid, b in dev.processes.items()]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:
        dev = self._device(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return [ProcessInfo(pid=pid, usedGpuMemory=b) for pid, b in dev.graphics_processes.items()]

    # -- internals ------------------------------------------------------------------------------
    def _gpm_device(self, handle: Handle, call: str) -> FakeDevice:
        return self._device(handle, call)

    def _gpm_error(self, code: int, text: str) -> Exception:
        return NVMLError(code, text)

    def _gpm_devices(self) -> list[FakeDevice]:
        return self.devices

    def _require_init(self) -> None:
        if self._initialized <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED, "Uninitialized")

    def _check(self, call: str, gpu: int | None = None) -> None:
        if call in self.fail_calls or (gpu is not None and call in self.devices[gpu].fail):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST, f"{call}: GPU is lost")

    def _device(self, handle: Handle, call: str) -> FakeDevice:
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
                    self._file_error = f"fake NVML file {self._path}: {err}"
                return
            self._stamp = stamp
            self._file_error = ""
            self.init_error, self.devices = config


def _parse_config(data: object) -> tuple[str | None, list[FakeDevice]]:
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
            FakeDevice(
                uuid=str(raw.get("uuid") or f"GPU-fake-{i}"),
                name=str(raw.get("name", "NVIDIA H200")),
                util=float(raw.get("util", 0.0)),
                mem_total=int(raw.get("mem_total", H200_BYTES)),
                mem_used=None if mem_used is None else int(mem_used),
                power_w=None if power is None else float(power),
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
