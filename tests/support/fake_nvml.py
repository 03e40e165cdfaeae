"""The simulator's GPU (supervisor/simulator/gpu) with knobs for unit tests: change a reading, make a
call fail, raise an Xid, all in memory. Daemon-level tests write the JSON file instead."""

from __future__ import annotations

from typing import Any

from supervisor.simulator.gpu import Handle, NVMLError, SimulatedDevice, SimulatedNvml

__all__ = ["FakeDevice", "FakeNvml", "Handle", "NVMLError", "SimulatedDevice"]

FakeDevice = SimulatedDevice  # the name tests used when this lived in probes/fake_nvml.py


class FakeNvml(SimulatedNvml):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.xid_queue: list[tuple[int, int]] = []

    def set_process(self, gpu: int, pid: int, used_bytes: int | None) -> None:
        self.devices[gpu].processes[pid] = used_bytes

    def remove_process(self, gpu: int, pid: int) -> None:
        self.devices[gpu].processes.pop(pid, None)
        self.devices[gpu].graphics_processes.pop(pid, None)

    def set_util(self, gpu: int, percent: float) -> None:
        self.devices[gpu].util = percent

    def set_memory(self, gpu: int, used: int | None) -> None:
        self.devices[gpu].mem_used = used

    def set_gpm(self, gpu: int, sm_util: float | None, sm_occupancy: float = 0.0) -> None:
        """SM activity and occupancy in percent; `sm_util=None`: GPM not supported on this GPU."""
        self.devices[gpu].gpm = None if sm_util is None else {"sm_util": sm_util, "sm_occupancy": sm_occupancy}

    def fail(self, call: str, gpu: int | None = None) -> None:
        """Make `call` raise NVMLError, on one GPU or (gpu=None) everywhere, until `heal`."""
        if gpu is None:
            self.fail_calls.add(call)
        else:
            self.devices[gpu].fail.add(call)

    def heal(self) -> None:
        self.fail_calls.clear()
        for dev in self.devices:
            dev.fail.clear()

    def raise_xid(self, gpu: int, xid: int) -> None:
        """Queue an Xid critical error on `gpu` for the event sets (as the file's `xid_events` do)."""
        self.xid_queue.append((gpu, xid))

    def _queued_xids(self) -> list[tuple[int, int]]:
        return list(self.xid_queue)
