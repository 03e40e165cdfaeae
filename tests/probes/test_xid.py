"""The Xid watcher against the fake NVML's event API (a real thread, real waits), and the policy."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fake_nvml import FakeNvml

from probes.xid import XidEvent, XidWatcher
from supervisor.policy.xidpolicy import blocking, describe, xid_action
from supervisor.simulator.gpu import SimulatedDevice


def _wait(pred, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_an_xid_raised_on_the_fake_is_read_by_the_watcher() -> None:
    nvml = FakeNvml([SimulatedDevice(uuid="GPU-a"), SimulatedDevice(uuid="GPU-b")])
    w = XidWatcher(nvml, wall=lambda: 1000.0, wait_ms=50)
    w.start()
    try:
        assert _wait(lambda: w.status == "watching")
        assert w.gpus == (0, 1)
        nvml.raise_xid(1, 79)
        nvml.raise_xid(0, 31)
        got: list[XidEvent] = []
        assert _wait(lambda: bool(got.extend(w.drain())) or len(got) >= 2)
        assert got == [XidEvent(1, "GPU-b", 79, 1000.0), XidEvent(0, "GPU-a", 31, 1000.0)]
        assert w.drain() == []  # each event once
    finally:
        w.stop()


def test_xid_events_come_from_the_fake_file(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"devices": [{"uuid": "GPU-a"}]}))
    w = XidWatcher(FakeNvml.from_file(path), wait_ms=50)
    w.start()
    try:
        assert _wait(lambda: w.status == "watching")
        path.write_text(json.dumps({"devices": [{"uuid": "GPU-a"}], "xid_events": [{"gpu": 0, "xid": 48}]}))
        got: list[XidEvent] = []
        assert _wait(lambda: bool(got.extend(w.drain())) or len(got) >= 1)
        assert [(e.gpu, e.xid) for e in got] == [(0, 48)]
    finally:
        w.stop()


def test_no_nvml_is_unavailable_and_the_thread_stops_quickly() -> None:
    w = XidWatcher(FakeNvml(init_error="Driver Not Loaded"), wait_ms=50, retry_s=30)
    w.start()
    assert _wait(lambda: w.status == "unavailable")
    assert "Driver Not Loaded" in w.reason
    tic = time.monotonic()
    w.stop()
    assert time.monotonic() - tic < 2
    assert XidWatcher(None).status == "unavailable"


@pytest.mark.parametrize(
    ("xid", "action"),
    [
        (13, "restart"),
        (31, "restart"),
        (43, "restart"),
        (94, "restart"),
        (999, "restart"),
        (48, "reset_gpu"),
        (64, "reset_gpu"),
        (79, "reset_gpu"),
        (95, "reset_gpu"),
        (119, "reset_gpu"),
        (120, "reset_gpu"),
    ],
)
def test_the_catalogue_decides_restart_or_reset(xid: int, action: str) -> None:
    assert xid_action(xid) == action


def test_only_a_reset_xid_on_a_server_gpu_blocks() -> None:
    app = XidEvent(0, "GPU-a", 31, 0.0)
    reset_other = XidEvent(3, "GPU-d", 79, 0.0)
    reset_ours = XidEvent(1, "GPU-b", 79, 0.0)
    assert blocking([app], None) is None
    assert blocking([app, reset_other], {0, 1}) is None
    assert blocking([app, reset_other, reset_ours], {0, 1}) == reset_ours
    assert blocking([reset_other], None) == reset_other  # the server's GPUs unknown: every GPU counts
    assert describe(reset_ours) == "Xid 79 on GPU 1 (GPU-b): GPU has fallen off the bus"


def test_a_gpu_that_refuses_events_does_not_blind_the_others() -> None:
    nvml = FakeNvml([SimulatedDevice(uuid="GPU-a"), SimulatedDevice(uuid="GPU-b")])
    nvml.fail("nvmlDeviceRegisterEvents", gpu=0)
    w = XidWatcher(nvml, wait_ms=50)
    w.start()
    try:
        assert _wait(lambda: w.status == "watching")
        assert w.gpus == (1,) and "GPU 0" in w.refused[0]
        nvml.raise_xid(1, 13)
        got: list[XidEvent] = []
        assert _wait(lambda: bool(got.extend(w.drain())) or len(got) >= 1)
        assert [(e.gpu, e.xid) for e in got] == [(1, 13)]
    finally:
        w.stop()
