from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest
from fake_nvml import FakeNvml, Handle

from probes.gpu import GpuProbe, load_pynvml
from probes.types import GpuDevice, GpuProcess
from supervisor.simulator.gpu import SimulatedDevice, SimulatedNvml

GiB = 1024**3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def two_gpus() -> FakeNvml:
    fake = FakeNvml(
        devices=[
            SimulatedDevice(uuid="GPU-a", util=3, power_w=75.5, processes={100: 60 * GiB, 999: 1 * GiB}),
            SimulatedDevice(uuid="GPU-b", util=97, processes={101: 70 * GiB}, graphics_processes={101: 2 * GiB}),
        ]
    )
    return fake


def test_devices_and_tree_attribution() -> None:
    probe = GpuProbe(two_gpus())
    obs = probe.observe({100, 101, 102})
    assert obs.status == "ok" and obs.reason == ""
    assert obs.devices == (
        GpuDevice(
            index=0,
            uuid="GPU-a",
            name="NVIDIA H200",
            util_percent=3.0,
            mem_used_bytes=61 * GiB,
            mem_total_bytes=143771 * 1024 * 1024,
            power_w=75.5,
        ),
        GpuDevice(
            index=1,
            uuid="GPU-b",
            name="NVIDIA H200",
            util_percent=97.0,
            mem_used_bytes=72 * GiB,
            mem_total_bytes=143771 * 1024 * 1024,
            power_w=None,
        ),
    )
    # pid 999 is not the tree's; 101 is in both listings and counts once
    assert obs.processes == (
        GpuProcess(pid=100, gpu_index=0, uuid="GPU-a", used_bytes=60 * GiB),
        GpuProcess(pid=101, gpu_index=1, uuid="GPU-b", used_bytes=70 * GiB),
    )
    assert obs.tree_mem_bytes == 130 * GiB
    assert obs.max_util_percent == 97.0


def test_snapshot_all_and_held_by() -> None:
    fake = two_gpus()
    fake.set_process(1, 100, 5 * GiB)
    fake.set_process(1, 103, None)  # listed with unknown memory: still holds a context
    probe = GpuProbe(fake)
    assert {p.pid for p in probe.snapshot_all().processes} == {100, 999, 101, 103}
    assert probe.held_by([100, 103, 4242]) == {100: 65 * GiB, 103: 0}
    fake.remove_process(0, 100)
    fake.remove_process(1, 100)
    fake.remove_process(1, 103)
    assert probe.held_by([100, 103]) == {}


def test_setters_change_the_next_observation() -> None:
    fake = two_gpus()
    probe = GpuProbe(fake)
    fake.set_util(0, 55)
    fake.set_memory(0, 7)
    fake.set_process(0, 100, 1)
    obs = probe.observe([100])
    assert (obs.devices[0].util_percent, obs.devices[0].mem_used_bytes) == (55.0, 7)
    assert obs.processes == (GpuProcess(pid=100, gpu_index=0, uuid="GPU-a", used_bytes=1),)


@pytest.mark.parametrize(
    ("call", "check"),
    [
        # Unread (a MIG slice): 0 for the gauges, and marked, so nothing reads it as an idle GPU.
        (
            "nvmlDeviceGetUtilizationRates",
            lambda d: d.util_percent == 0.0 and not d.util_read and d.mem_used_bytes == 72 * GiB,
        ),
        (
            "nvmlDeviceGetMemoryInfo",
            lambda d: (d.mem_used_bytes, d.mem_total_bytes) == (0, 0) and d.util_percent == 97 and d.util_read,
        ),
        ("nvmlDeviceGetUUID", lambda d: d.uuid == "" and d.name == "NVIDIA H200"),
        ("nvmlDeviceGetName", lambda d: d.name == "" and d.uuid == "GPU-b"),
        ("nvmlDeviceGetPowerUsage", lambda d: d.power_w is None),
    ],
)
def test_one_failing_call_degrades_one_field(call: str, check: Any) -> None:
    fake = two_gpus()
    fake.fail(call, gpu=1)
    obs = GpuProbe(fake).observe([100, 101])
    assert obs.status == "ok"
    assert obs.devices[0].uuid == "GPU-a" and obs.devices[0].util_percent == 3.0
    assert check(obs.devices[1])


def test_failing_process_listing_keeps_the_other_listing() -> None:
    fake = two_gpus()
    fake.fail("nvmlDeviceGetComputeRunningProcesses", gpu=1)
    obs = GpuProbe(fake).observe([100, 101])
    assert obs.processes == (
        GpuProcess(pid=100, gpu_index=0, uuid="GPU-a", used_bytes=60 * GiB),
        GpuProcess(pid=101, gpu_index=1, uuid="GPU-b", used_bytes=2 * GiB),
    )


def test_lost_gpu_handle_skips_that_gpu() -> None:
    fake = two_gpus()
    fake.fail("nvmlDeviceGetHandleByIndex", gpu=0)
    obs = GpuProbe(fake).observe([100, 101])
    assert [d.index for d in obs.devices] == [1]
    fake.fail("nvmlDeviceGetHandleByIndex", gpu=1)
    obs = GpuProbe(fake).observe([100])
    assert obs.status == "unavailable"
    assert "GPU handles" in obs.reason


def test_no_gpus_is_unavailable() -> None:
    obs = GpuProbe(FakeNvml(devices=[])).observe([1])
    assert (obs.status, obs.reason, obs.devices) == ("unavailable", "no NVIDIA GPU found", ())


def test_count_failure_is_unavailable() -> None:
    fake = two_gpus()
    fake.fail("nvmlDeviceGetCount")
    obs = GpuProbe(fake).observe([1])
    assert obs.status == "unavailable"
    assert obs.reason.startswith("nvmlDeviceGetCount failed")


def test_init_failure_is_retried_at_most_every_60_s() -> None:
    fake = two_gpus()
    fake.init_error = "Driver Not Loaded"
    clock = Clock()
    probe = GpuProbe(fake, monotonic=clock)
    obs = probe.observe([100])
    assert obs.status == "unavailable"
    assert obs.reason == "nvmlInit failed: Driver Not Loaded"
    fake.init_error = None
    clock.now += 59
    assert probe.observe([100]).reason == "nvmlInit failed: Driver Not Loaded"
    assert fake.init_calls == 1
    clock.now += 2
    assert probe.observe([100]).status == "ok"
    assert probe.observe([100]).status == "ok"
    assert fake.init_calls == 2


def test_close_shuts_nvml_down_once() -> None:
    fake = two_gpus()
    probe = GpuProbe(fake)
    probe.close()
    assert fake.shutdown_calls == 0  # never initialised
    probe.observe([])
    probe.close()
    probe.close()
    assert fake.shutdown_calls == 1
    assert probe.observe([]).status == "ok"  # a closed probe initialises again when used
    assert fake.init_calls == 2
    probe.close()
    assert fake.shutdown_calls == 2


def test_missing_pynvml_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    probe = GpuProbe()
    obs = probe.observe([1])
    assert obs.status == "unavailable"
    assert obs.reason.startswith("pynvml is not installed")
    assert probe.held_by([1]) == {}
    assert probe.snapshot_all().status == "unavailable"
    probe.close()
    assert load_pynvml() is None


class Exploding:
    """Every NVML function raises something that is not even an NVMLError."""

    def __getattr__(self, name: str) -> Any:
        def boom(*args: object) -> NoReturn:
            raise RuntimeError(f"{name} exploded")

        return boom


def test_a_raising_library_never_raises_out() -> None:
    probe = GpuProbe(Exploding())
    obs = probe.observe([1])
    assert (obs.status, obs.reason) == ("unavailable", "nvmlInit failed: nvmlInit exploded")
    probe.close()


class BytesNames(FakeNvml):
    """Older pynvml returns names and UUIDs as bytes."""

    def nvmlDeviceGetName(self, handle: Handle) -> bytes:  # type: ignore[override]
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: Handle) -> bytes:  # type: ignore[override]
        return b"GPU-\xff"


def test_bytes_names_are_decoded() -> None:
    obs = GpuProbe(BytesNames(devices=[SimulatedDevice()])).observe([])
    assert (obs.devices[0].name, obs.devices[0].uuid) == ("NVIDIA H100 80GB HBM3", "GPU-\ufffd")


def write_json(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def test_simulated_gpu_file_follows_changes(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    write_json(
        path,
        {"devices": [{"uuid": "GPU-x", "util": 2, "mem_total": 100, "processes": {"4242": 40, "7": None}}]},
    )
    probe = GpuProbe(SimulatedNvml.from_file(path))
    obs = probe.observe([4242])
    assert obs.devices == (
        GpuDevice(index=0, uuid="GPU-x", name="NVIDIA H200", util_percent=2.0, mem_used_bytes=40, mem_total_bytes=100),
    )
    assert obs.processes == (GpuProcess(pid=4242, gpu_index=0, uuid="GPU-x", used_bytes=40),)

    write_json(
        path,
        {
            "devices": [
                {"uuid": "GPU-x", "util": 100, "mem_total": 100, "mem_used": 90, "power_w": 25.0, "processes": {}},
                {"uuid": "GPU-y", "graphics_processes": {"4242": 8}, "fail": ["nvmlDeviceGetUtilizationRates"]},
            ]
        },
    )
    obs = probe.observe([4242])
    assert [(d.uuid, d.util_percent, d.mem_used_bytes, d.power_w) for d in obs.devices] == [
        ("GPU-x", 100.0, 90, 25.0),
        ("GPU-y", 0.0, 8, None),
    ]
    assert probe.held_by([4242]) == {4242: 8}

    path.write_text('{"devices": [', encoding="utf-8")  # half-written: the last good file stays
    assert len(probe.observe([4242]).devices) == 2

    write_json(path, {"init_error": "Driver Not Loaded", "devices": []})
    # already initialised, so only the device count changes
    assert probe.observe([4242]).reason == "no NVIDIA GPU found"


@pytest.mark.parametrize("content", [None, "not json", '{"devices": {}}', '{"devices": [{"processes": [1]}]}'])
def test_simulated_gpu_file_missing_or_invalid_from_the_start(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "nvml.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    obs = GpuProbe(SimulatedNvml.from_file(path)).observe([1])
    assert obs.status == "unavailable"
    assert str(path) in obs.reason


def test_simulated_gpu_file_init_error(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    write_json(path, {"init_error": "Driver Not Loaded", "devices": [{}]})
    obs = GpuProbe(SimulatedNvml.from_file(path)).observe([1])
    assert (obs.status, obs.reason) == ("unavailable", "nvmlInit failed: Driver Not Loaded")


def test_load_pynvml_is_the_module() -> None:
    pynvml = pytest.importorskip("pynvml")
    assert load_pynvml() is pynvml


@pytest.mark.gpu
def test_real_nvml() -> None:
    pytest.importorskip("pynvml")
    probe = GpuProbe()
    try:
        obs = probe.snapshot_all()
        if obs.status == "unavailable":
            pytest.skip(f"no usable NVML here: {obs.reason}")
        assert obs.devices
        for dev in obs.devices:
            assert dev.uuid.startswith(("GPU-", "MIG-"))
            assert dev.name
            assert 0 <= dev.util_percent <= 100
            assert dev.mem_total_bytes > 0
            assert 0 <= dev.mem_used_bytes <= dev.mem_total_bytes
        mine = probe.observe([os.getpid()])
        assert mine.status == "ok"
        assert all(p.pid == os.getpid() for p in mine.processes)
        assert set(probe.held_by([os.getpid()])) <= {os.getpid()}
    finally:
        probe.close()
