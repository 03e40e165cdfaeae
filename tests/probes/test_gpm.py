"""The GPM probe against the fake NVML (pynvml's GPM names and shapes), and its failure paths."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_nvml import FakeNvml

from probes.gpm import GpmProbe
from probes.gpu import GpuProbe
from supervisor.simulator.gpu import SimulatedDevice


def _probes(fake: FakeNvml) -> tuple[GpuProbe, GpmProbe]:
    gpu = GpuProbe(fake)
    return gpu, GpmProbe(gpu.nvml)


def test_two_samples_per_reading_then_one_per_poll() -> None:
    # The H200 readings: a spinning kernel (util 100 %, SM 0.76 %, occupancy 0.01 %).
    fake = FakeNvml([SimulatedDevice(util=100, gpm={"sm_util": 0.76, "sm_occupancy": 0.01})])
    gpu, gpm = _probes(fake)
    first = gpm.observe(gpu.observe([]))
    assert first.status == "ok" and first.devices == ()  # the first sample waits for its pair
    second = gpm.observe(gpu.observe([]))
    (dev,) = second.devices
    assert dev.uuid == "GPU-fake-0" and dev.sm_active_ratio == 0.0076 and dev.sm_occupancy_ratio == 0.0001
    fake.set_gpm(0, 4.8, 0.4)  # the tiny model serving 8 clients
    assert gpm.observe(gpu.observe([])).devices[0].sm_active_ratio == 0.048
    assert fake.gpm_samples_live == 1  # the previous sample is freed each poll
    gpm.close()
    assert fake.gpm_samples_live == 0


def test_unsupported_gpu_says_so_and_others_still_read() -> None:
    fake = FakeNvml([SimulatedDevice(gpm=None), SimulatedDevice(gpm={"sm_util": 50.0})])
    gpu, gpm = _probes(fake)
    gpm.observe(gpu.observe([]))
    got = gpm.observe(gpu.observe([]))
    assert got.status == "ok" and [d.index for d in got.devices] == [1]
    assert "GPU 0: GPM not supported" in got.reason
    assert gpm.support(gpu.observe([])) == (
        True,
        "GPU 0: GPM not supported on this GPU (Hopper or newer needed); GPU 1: ok",
    )


def test_no_gpu_supports_gpm_is_unavailable() -> None:
    fake = FakeNvml([SimulatedDevice()])
    gpu, gpm = _probes(fake)
    got = gpm.observe(gpu.observe([]))
    assert got.status == "unavailable" and "not supported" in got.reason
    ok, detail = gpm.support(gpu.observe([]))
    assert not ok and "Hopper" in detail


def test_mig_mode_is_unavailable() -> None:
    fake = FakeNvml([SimulatedDevice(gpm={"sm_util": 1.0})])
    fake.nvmlDeviceGetMigMode = lambda handle: [1, 1]  # type: ignore[attr-defined]
    gpu, gpm = _probes(fake)
    got = gpm.observe(gpu.observe([]))
    assert got.status == "unavailable" and "MIG" in got.reason


def test_a_binding_without_gpm_or_without_nvml() -> None:
    old = SimpleNamespace(nvmlDeviceGetHandleByIndex=lambda i: i)  # an nvidia-ml-py before 12.535
    got = GpmProbe(old).observe(GpuProbe(FakeNvml([SimulatedDevice()])).observe([]))
    assert got.status == "unavailable" and "no GPM" in got.reason
    assert GpmProbe(None).observe(GpuProbe(FakeNvml([SimulatedDevice()])).observe([])).reason == "NVML is not available"
    broken = FakeNvml([SimulatedDevice(gpm={"sm_util": 1.0})], init_error="Driver Not Loaded")
    gpu, gpm = _probes(broken)
    got = gpm.observe(gpu.observe([]))
    assert got.status == "unavailable" and "Driver Not Loaded" in got.reason


def test_a_failing_sample_degrades_one_poll_only() -> None:
    fake = FakeNvml([SimulatedDevice(gpm={"sm_util": 10.0})])
    gpu, gpm = _probes(fake)
    gpm.observe(gpu.observe([]))
    fake.fail("nvmlGpmSampleGet")
    got = gpm.observe(gpu.observe([]))
    assert got.status == "unavailable" and "nvmlGpmSampleGet failed" in got.reason
    fake.heal()
    gpm.observe(gpu.observe([]))
    assert gpm.observe(gpu.observe([])).devices[0].sm_active_ratio == 0.1


def test_fake_nvml_file_drives_gpm(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"devices": [{"util": 100, "gpm": {"sm_util": 0.76, "sm_occupancy": 0.01}}]}))
    fake = FakeNvml.from_file(path)
    gpu, gpm = _probes(fake)
    gpm.observe(gpu.observe([]))
    assert gpm.observe(gpu.observe([])).devices[0].sm_active_ratio == 0.0076


def test_the_real_bindings_structures_take_what_the_probe_writes() -> None:
    """pynvml's own ctypes structures (c_nvmlGpmMetricsGet_t, opaque sample pointers), with the C calls
    stood in by Python: the probe's field writes and reads must fit the real layout."""
    import ctypes

    pynvml = pytest.importorskip("pynvml")
    samples: dict[int, float] = {}

    def sample_alloc() -> object:
        s = pynvml.c_nvmlGpmSample_t(pynvml.struct_c_nvmlGpmSample_t())
        return s

    def sample_get(handle: object, sample: object) -> object:
        samples[ctypes.addressof(sample.contents)] = 0.76  # type: ignore[attr-defined]
        return sample

    def metrics_get(req: object) -> object:
        assert req.version == pynvml.NVML_GPM_METRICS_GET_VERSION and req.numMetrics == 2  # type: ignore[attr-defined]
        assert ctypes.addressof(req.sample2.contents) in samples  # type: ignore[attr-defined]
        for m in req.metrics[:2]:  # type: ignore[attr-defined]
            m.value, m.nvmlReturn = (0.76 if m.metricId == pynvml.NVML_GPM_METRIC_SM_UTIL else 0.01), 0
        return req

    fake = FakeNvml([SimulatedDevice(util=100)])
    binding = SimpleNamespace(
        nvmlDeviceGetHandleByIndex=fake.nvmlDeviceGetHandleByIndex,
        nvmlGpmQueryDeviceSupport=lambda h: SimpleNamespace(isSupportedDevice=1),
        nvmlGpmSampleAlloc=sample_alloc,
        nvmlGpmSampleGet=sample_get,
        nvmlGpmSampleFree=lambda s: None,
        nvmlGpmMetricsGet=metrics_get,
        c_nvmlGpmMetricsGet_t=pynvml.c_nvmlGpmMetricsGet_t,
        NVML_GPM_METRICS_GET_VERSION=pynvml.NVML_GPM_METRICS_GET_VERSION,
        NVML_GPM_METRIC_SM_UTIL=pynvml.NVML_GPM_METRIC_SM_UTIL,
        NVML_GPM_METRIC_SM_OCCUPANCY=pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    )
    gpu = GpuProbe(fake)
    gpm = GpmProbe(binding)
    gpm.observe(gpu.observe([]))
    got = gpm.observe(gpu.observe([]))
    assert got.status == "ok", got
    assert got.devices[0].sm_active_ratio == 0.0076 and got.devices[0].sm_occupancy_ratio == 0.0001
