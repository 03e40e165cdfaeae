"""GPU tests: skipped unless NVML answers with a GPU and torch is installed (CI has neither).

They run the daemon against `bench/gpuserver` (importable once the repository root is on sys.path).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _gpu_absent() -> str | None:
    """Why the GPU tests cannot run here, or None."""
    from probes.gpu import GpuProbe

    probe = GpuProbe()  # the real NVML: pynvml
    try:
        obs = probe.observe([])
    finally:
        probe.close()
    if obs.status != "ok":
        return f"no GPU through NVML ({obs.reason})"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (the GPU server allocates through it)"
    return None


@pytest.fixture(scope="session")
def gpu() -> None:
    reason = _gpu_absent()
    if reason is not None:
        pytest.skip(reason)
