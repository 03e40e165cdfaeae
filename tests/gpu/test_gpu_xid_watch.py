"""The Xid watcher on the real NVML: every GPU registers for Xid critical errors and the wait times
out quietly (no Xid is provoked here: bench/real lane `xid` does that inside real SGLang)."""

from __future__ import annotations

import time

import pytest

from probes.xid import XidWatcher

pytestmark = pytest.mark.gpu


def test_the_real_nvml_registers_every_gpu_for_xid_events(gpu: None) -> None:
    import pynvml

    w = XidWatcher(pynvml, wait_ms=200)
    w.start()
    try:
        deadline = time.monotonic() + 10
        while w.status == "starting" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert w.status == "watching", w.reason
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
        assert len(w.gpus) + len(w.refused) == count and w.gpus
        time.sleep(0.5)
        assert w.drain() == []  # nothing provoked, nothing reported
    finally:
        w.stop()
