"""Metric families for GPM SM activity and the busy-thread looks, read from the status snapshot at
scrape time (supervisor/metrics/exporter.py yields them with its own). docs/METRICS.md describes them."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from supervisor.status.snapshot import StatusSnapshot

PREFIX = "sglang_supervisor_"
GPU_LABELS = ["gpu", "uuid"]


def busy_families(s: StatusSnapshot | None) -> Iterator[Metric]:
    gpm_up = GaugeMetricFamily(PREFIX + "gpu_gpm_up", "1 when NVML GPM (SM activity) was read on the last poll, else 0")
    active = GaugeMetricFamily(
        PREFIX + "gpu_sm_active_ratio",
        "Share of SMs busy over the last poll interval, 0..1 (NVML GPM SM_UTIL); 100 % utilisation "
        "with near-0 SM activity is a kernel spinning",
        labels=GPU_LABELS,
    )
    occupancy = GaugeMetricFamily(
        PREFIX + "gpu_sm_occupancy_ratio",
        "Resident warps against the theoretical maximum over the last poll, 0..1 (NVML GPM SM_OCCUPANCY)",
        labels=GPU_LABELS,
    )
    waits = GaugeMetricFamily(
        PREFIX + "startup_gpu_wait_looks",
        "While starting: py-spy looks (since strong progress) that found every busy thread waiting on the GPU",
    )
    if s is not None:
        gpm_up.add_metric([], 1.0 if s.gpu.gpm_status == "ok" else 0.0)
        for d in s.gpu.devices:
            labels = [str(d.index), d.uuid]
            if d.sm_active_ratio is not None:
                active.add_metric(labels, d.sm_active_ratio)
            if d.sm_occupancy_ratio is not None:
                occupancy.add_metric(labels, d.sm_occupancy_ratio)
        waits.add_metric([], float(sum(k == "gpu_wait" for k in s.busy.kinds)))
    yield from (gpm_up, active, occupancy, waits)
