"""The GPU scope against the real NVML: CUDA_VISIBLE_DEVICES by index and by UUID prefix selects
exactly those devices (skipped without a GPU, like every test here)."""

from __future__ import annotations

import pytest

from probes.gpu import GpuProbe
from probes.gpuscope import DeviceScope

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu")]


def test_a_scope_by_index_and_by_uuid_prefix_on_the_real_nvml() -> None:
    everything = GpuProbe()
    try:
        devices = everything.observe([]).devices
    finally:
        everything.close()
    assert devices
    last = devices[-1]
    for spec in (str(last.index), last.uuid[:12]):
        probe = GpuProbe(scope=DeviceScope.parse(spec))
        try:
            seen = probe.observe([])
        finally:
            probe.close()
        assert seen.status == "ok" and [d.uuid for d in seen.devices] == [last.uuid], spec
