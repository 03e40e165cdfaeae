"""The NVML object the daemon's GPU, GPM and Xid probes read, as `[gpu]` chooses it.

The probes take an NVML-like object and never pick one themselves (as an httpx client takes a
transport): the real NVML (pynvml) unless the config asks for the simulator's GPU, a JSON file that
the simulated server and the tests write (supervisor/simulator/gpu). Nothing in the environment
switches it.
"""

from __future__ import annotations

from probes.gpu import NvmlLike, load_pynvml
from supervisor.config.gpu import GpuSettings


def open_nvml(gpu: GpuSettings) -> NvmlLike | None:
    """A fresh NVML object for one probe (the Xid watcher waits in its own); None: pynvml is absent
    (the GPU probe then reports `unavailable`)."""
    if gpu.source == "simulator" and gpu.file:
        from supervisor.simulator.gpu import SimulatedNvml

        return SimulatedNvml.from_file(gpu.file)
    return load_pynvml()
