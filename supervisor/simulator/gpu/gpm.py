"""GPM for the simulated GPU (nvml.py): pynvml's GPM functions, names and shapes.

A device's `gpm` is None where GPM is not supported (`nvmlGpmQueryDeviceSupport` says so), else the
SM activity and occupancy in percent, as NVML reports them. A metrics read between two samples
returns the values the device had at the second sample: there are no counters to difference.
In the JSON file (see nvml.py): `"gpm": {"sm_util": 0.76, "sm_occupancy": 0.01}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_MAX = 98
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3


@dataclass
class GpmSupport:
    version: int = 1
    isSupportedDevice: int = 0


@dataclass
class GpmSample:
    device: int | None = None  # set by nvmlGpmSampleGet
    values: dict[int, float] = field(default_factory=dict)
    freed: bool = False


@dataclass
class GpmMetric:
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0


@dataclass
class GpmMetricsGet:
    """Shaped like pynvml.c_nvmlGpmMetricsGet_t."""

    version: int = 0
    numMetrics: int = 0
    sample1: GpmSample | None = None
    sample2: GpmSample | None = None
    metrics: list[GpmMetric] = field(default_factory=lambda: [GpmMetric() for _ in range(NVML_GPM_METRIC_MAX)])


class _Device(Protocol):
    gpm: dict[str, float] | None


class SimulatedGpm:
    """Mixed into SimulatedNvml; `_gpm_device(handle, call)` gives the device or raises NVMLError."""

    NVML_GPM_METRIC_SM_UTIL = NVML_GPM_METRIC_SM_UTIL
    NVML_GPM_METRIC_SM_OCCUPANCY = NVML_GPM_METRIC_SM_OCCUPANCY
    NVML_GPM_METRICS_GET_VERSION = NVML_GPM_METRICS_GET_VERSION
    c_nvmlGpmMetricsGet_t = GpmMetricsGet
    gpm_samples_live = 0  # allocated and not freed: a probe that leaks shows here

    def _gpm_device(self, handle: Any, call: str) -> _Device:
        raise NotImplementedError

    def _gpm_error(self, code: int, text: str) -> Exception:
        raise NotImplementedError

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> GpmSupport:
        dev = self._gpm_device(handle, "nvmlGpmQueryDeviceSupport")
        return GpmSupport(isSupportedDevice=0 if dev.gpm is None else 1)

    def nvmlGpmSampleAlloc(self) -> GpmSample:
        self.gpm_samples_live += 1
        return GpmSample()

    def nvmlGpmSampleFree(self, sample: GpmSample) -> None:
        if sample.freed:
            raise self._gpm_error(NVML_ERROR_INVALID_ARGUMENT, "sample freed twice")
        sample.freed = True
        self.gpm_samples_live -= 1

    def nvmlGpmSampleGet(self, handle: Any, sample: GpmSample) -> GpmSample:
        dev = self._gpm_device(handle, "nvmlGpmSampleGet")
        if dev.gpm is None:
            raise self._gpm_error(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        sample.device = int(handle.index)
        sample.values = {
            NVML_GPM_METRIC_SM_UTIL: float(dev.gpm.get("sm_util", 0.0)),
            NVML_GPM_METRIC_SM_OCCUPANCY: float(dev.gpm.get("sm_occupancy", 0.0)),
        }
        return sample

    def nvmlGpmMetricsGet(self, req: GpmMetricsGet) -> GpmMetricsGet:
        first, second = req.sample1, req.sample2
        if first is None or second is None or first.device is None or first.device != second.device:
            raise self._gpm_error(NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument")
        for metric in req.metrics[: req.numMetrics]:
            if metric.metricId in second.values:
                metric.value, metric.nvmlReturn = second.values[metric.metricId], 0
            else:
                metric.value, metric.nvmlReturn = 0.0, NVML_ERROR_NOT_SUPPORTED
        return req


def parse_gpm(raw: object) -> dict[str, float] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("gpm must be an object like {\"sm_util\": 0.76, \"sm_occupancy\": 0.01} or null")
    return {"sm_util": float(raw.get("sm_util", 0.0)), "sm_occupancy": float(raw.get("sm_occupancy", 0.0))}
