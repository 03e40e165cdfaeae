"""NVML GPU performance monitoring (GPM): how much of each GPU is working, not only whether a kernel is resident.

NVML's utilisation says that some kernel was resident during the sample period; one kernel spinning
on a flag reads 100 %. GPM (`nvmlGpmSampleGet` / `nvmlGpmMetricsGet`, Hopper and newer, in
nvidia-ml-py) reads SM activity between two samples: measured on an H200, that spin read SM activity
0.76 % and occupancy 0.01 %, a tiny model serving 8 clients 3.4-4.8 % and 0.3-0.4 %.

One sample per device per poll; the previous one is kept, so each poll's reading covers the poll
interval. Blocking (called from the observer's worker thread, right after the GPU probe, with the
same NVML object); never raises: where GPM cannot be read (older GPU, MIG mode, no permission,
nvidia-ml-py without GPM, a fake NVML without it) the observation says `unavailable` and why.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from probes.types import GpmDevice, GpmObservation, GpuObservation

# pynvml's constants; a module without them has no GPM.
SM_UTIL = "NVML_GPM_METRIC_SM_UTIL"  # 2: percentage of SMs busy
SM_OCCUPANCY = "NVML_GPM_METRIC_SM_OCCUPANCY"  # 3: warps resident vs the theoretical maximum
_NEEDED = (
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmSampleFree",
    "nvmlGpmMetricsGet",
    "c_nvmlGpmMetricsGet_t",
    SM_UTIL,
    SM_OCCUPANCY,
)


def _err(err: BaseException) -> str:
    return (str(err).strip() or type(err).__name__)[:160]


class GpmProbe:
    """SM activity per GPU from GPM; `nvml` is the object the GPU probe uses (pynvml or the simulator's GPU)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._prev: dict[int, Any] = {}  # device index -> the last sample taken
        self._unsupported: dict[int, str] = {}  # device index -> why GPM cannot be read there
        missing = [n for n in _NEEDED if nvml is None or not hasattr(nvml, n)]
        self._absent = (
            "NVML is not available"
            if nvml is None
            else f"this NVML binding has no GPM ({', '.join(missing[:2])}...; nvidia-ml-py >= 12.535 has it)"
            if missing
            else ""
        )

    def observe(self, gpu: GpuObservation) -> GpmObservation:
        """One reading per device of `gpu` (an observation the GPU probe just made with the same NVML)."""
        if self._absent:
            return GpmObservation(status="unavailable", reason=self._absent)
        if gpu.status != "ok":
            self.forget()
            return GpmObservation(status="unavailable", reason=f"NVML unavailable: {gpu.reason}")
        with self._lock:
            devices: list[GpmDevice] = []
            reasons: list[str] = []
            for dev in gpu.devices:
                reading = self._read(dev.index, dev.uuid)
                if isinstance(reading, str):
                    if reading:
                        reasons.append(f"GPU {dev.index}: {reading}")
                else:
                    devices.append(reading)
        if not devices and reasons:
            return GpmObservation(status="unavailable", reason="; ".join(reasons)[:400])
        return GpmObservation(status="ok", reason="; ".join(reasons)[:400], devices=tuple(devices))

    def support(self, gpu: GpuObservation) -> tuple[bool, str]:
        """Whether GPM can be read on the GPUs of `gpu` (for the self-check), and the details."""
        if self._absent:
            return False, self._absent
        if gpu.status != "ok":
            return False, f"NVML unavailable: {gpu.reason}"
        found: list[str] = []
        ok = False
        with self._lock:
            for dev in gpu.devices:
                try:
                    handle = self._nvml.nvmlDeviceGetHandleByIndex(dev.index)
                except Exception as err:
                    found.append(f"GPU {dev.index}: no handle ({_err(err)})")
                    continue
                why = self._support(dev.index, handle)
                ok = ok or not why
                found.append(f"GPU {dev.index}: {why or 'ok'}")
        return ok, "; ".join(found)[:400] or "no GPU"

    def forget(self) -> None:
        """Free the kept samples (NVML went away, or the daemon closes)."""
        with self._lock:
            for sample in self._prev.values():
                self._free(sample)
            self._prev.clear()

    def close(self) -> None:
        self.forget()

    # -- internals ----------------------------------------------------------------------------------
    def _read(self, index: int, uuid: str) -> GpmDevice | str:
        """A reading, "" while the first sample waits for its pair, or why this device has none."""
        nvml = self._nvml
        if index in self._unsupported:
            return self._unsupported[index]
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:
            return f"no handle ({_err(err)})"
        if index not in self._prev:
            why = self._support(index, handle)
            if why:
                self._unsupported[index] = why
                return why
        try:
            sample = nvml.nvmlGpmSampleAlloc()
        except Exception as err:
            return f"nvmlGpmSampleAlloc failed ({_err(err)})"
        try:
            nvml.nvmlGpmSampleGet(handle, sample)
        except Exception as err:
            self._free(sample)
            return f"nvmlGpmSampleGet failed ({_err(err)})"
        prev = self._prev.pop(index, None)
        self._prev[index] = sample
        if prev is None:
            return ""
        try:
            return self._metrics(index, uuid, prev, sample)
        except Exception as err:
            return f"nvmlGpmMetricsGet failed ({_err(err)})"
        finally:
            self._free(prev)

    def _support(self, index: int, handle: Any) -> str:
        nvml = self._nvml
        try:
            mig = nvml.nvmlDeviceGetMigMode(handle) if hasattr(nvml, "nvmlDeviceGetMigMode") else None
        except Exception:
            mig = None  # not a MIG-capable GPU
        if isinstance(mig, (list, tuple)) and mig and mig[0] == 1:
            return "MIG mode is on (GPM of the whole GPU is not readable per slice here)"
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(handle)
        except Exception as err:
            return f"GPM not supported ({_err(err)})"
        if not getattr(support, "isSupportedDevice", 0):
            return "GPM not supported on this GPU (Hopper or newer needed)"
        return ""

    def _metrics(self, index: int, uuid: str, first: Any, second: Any) -> GpmDevice | str:
        nvml = self._nvml
        req = nvml.c_nvmlGpmMetricsGet_t()
        req.version = getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
        req.numMetrics = 2
        req.sample1 = first
        req.sample2 = second
        req.metrics[0].metricId = getattr(nvml, SM_UTIL)
        req.metrics[1].metricId = getattr(nvml, SM_OCCUPANCY)
        out = nvml.nvmlGpmMetricsGet(req)
        util, occ = out.metrics[0], out.metrics[1]
        if getattr(util, "nvmlReturn", 0) != 0:
            return f"SM activity not readable (NVML return {util.nvmlReturn})"
        return GpmDevice(
            index=index,
            uuid=uuid,
            sm_active_ratio=_ratio(util.value),
            sm_occupancy_ratio=_ratio(occ.value) if getattr(occ, "nvmlReturn", 0) == 0 else None,
        )

    def _free(self, sample: Any) -> None:
        with contextlib.suppress(Exception):  # a sample of a GPU that went away: nothing to give back
            self._nvml.nvmlGpmSampleFree(sample)


def _ratio(percent: object) -> float:
    try:
        value = float(percent)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    if value != value:
        return 0.0
    return round(min(1.0, max(0.0, value / 100.0)), 6)
