"""The simulator's GPU: an NVML stand-in read from a JSON file, which the simulated server writes
to (a never-ending kernel) and the daemon reads when its config says `[gpu] source = "simulator"`.

The demo and the tests choose it by configuration, as httpx takes a transport; no environment
variable switches the daemon's GPU probe to it.
"""

from __future__ import annotations

from supervisor.simulator.gpu.errors import NVMLError
from supervisor.simulator.gpu.nvml import H200_BYTES, Handle, SimulatedDevice, SimulatedNvml

__all__ = ["H200_BYTES", "Handle", "NVMLError", "SimulatedDevice", "SimulatedNvml"]
