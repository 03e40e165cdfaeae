"""CUDA_VISIBLE_DEVICES read as CUDA reads it, and the GPU probe seeing only the server's GPUs."""

from __future__ import annotations

import pytest
from fake_nvml import FakeNvml

from probes.gpu import GpuProbe
from probes.gpuscope import DeviceScope
from supervisor.simulator.gpu import SimulatedDevice

GiB = 1024**3


@pytest.mark.parametrize(
    ("value", "index", "uuid", "seen"),
    [
        (None, 7, "GPU-x", True),  # unset: every GPU
        ("", 0, "GPU-x", False),  # empty: none
        ("0,1,2,3", 3, "GPU-x", True),
        ("0,1,2,3", 4, "GPU-x", False),
        (" 4, 5 ,6,7", 5, "GPU-x", True),
        ("GPU-8932f937", 6, "GPU-8932F937-d72c-4106-c12f-20bd9faed9f6", True),  # a unique prefix, any case
        ("GPU-8932f937", 6, "GPU-11111111-d72c", False),
        ("MIG-abcd", 0, "MIG-abcd-1234", True),
        ("0,1,foo,2", 2, "GPU-x", False),  # CUDA stops at the first invalid entry
        ("0,1,foo,2", 1, "GPU-x", True),
        ("-1", 0, "GPU-x", False),  # -1 hides everything in CUDA too
    ],
)
def test_matches_like_cuda(value: str | None, index: int, uuid: str, seen: bool) -> None:
    assert DeviceScope.parse(value).matches(index, uuid) is seen


def test_the_servers_env_wins_over_the_daemons() -> None:
    assert DeviceScope.for_server({"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "0"}).indices == {4, 5}
    assert DeviceScope.for_server({}, {"CUDA_VISIBLE_DEVICES": "0"}).indices == {0}
    assert DeviceScope.for_server({}, {}).everything
    assert "ignoring 'x'" in DeviceScope.parse("0,x").describe()


def fake_host() -> FakeNvml:
    return FakeNvml(
        devices=[
            SimulatedDevice(uuid="GPU-0000", processes={100: 60 * GiB}),
            SimulatedDevice(uuid="GPU-1111", processes={100: 60 * GiB}),
            SimulatedDevice(uuid="GPU-2222", processes={900: 70 * GiB}),  # the neighbour's server
            SimulatedDevice(uuid="GPU-3333", processes={900: 70 * GiB}),
        ]
    )


def test_the_probe_reads_only_the_scope_but_the_release_check_every_gpu() -> None:
    probe = GpuProbe(fake_host(), scope=DeviceScope.parse("0,1"))
    obs = probe.observe([100, 900])
    assert [d.index for d in obs.devices] == [0, 1]
    assert {p.pid for p in obs.processes} == {100}, "the neighbour's pid is on GPUs out of scope"
    assert sum(d.mem_used_bytes for d in obs.devices) == 120 * GiB
    assert [d.uuid for d in probe.snapshot_all().devices] == ["GPU-0000", "GPU-1111"]
    # a stray process of the tree on a GPU out of scope still blocks the release check
    assert probe.held_by([900]) == {900: 140 * GiB}
    everywhere = probe.observe([900], scoped=False)
    assert len(everywhere.devices) == 4 and everywhere.tree_mem_bytes == 140 * GiB


def test_a_scope_by_uuid_and_one_that_matches_nothing() -> None:
    assert [
        d.index for d in GpuProbe(fake_host(), scope=DeviceScope.parse("GPU-2222,GPU-3333")).observe([]).devices
    ] == [2, 3]
    obs = GpuProbe(fake_host(), scope=DeviceScope.parse("6,7")).observe([])
    assert obs.status == "unavailable" and "CUDA_VISIBLE_DEVICES=6,7" in obs.reason
