"""The simulated GPU's JSON file as daemon-level tests write it (`[gpu] source = "simulator"`): one
GPU whose processes the test names, and a second held by a process not of the tree."""

from __future__ import annotations

import json
import os
from pathlib import Path

GB = 1024**3


def write_nvml(path: Path, processes: dict[int, int], util: float = 0.0) -> None:
    doc = {
        "devices": [
            {
                "uuid": "GPU-aaaa",
                "name": "NVIDIA H200",
                "util": util,
                "processes": {str(p): b for p, b in processes.items()},
            },
            {"uuid": "GPU-bbbb", "util": 0, "processes": {"999999": 5 * GB}},  # not ours
        ]
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def idle_gpu(tmp_path: Path, gpm: bool = True) -> Path:
    """One GPU at 0 % with 1 GiB held, and GPM's SM activity and occupancy at 0 where `gpm` (the
    simulator's busy hangs then read it busy with idle SMs: tests/integration/test_busy_hangs.py)."""
    dev: dict[str, object] = {"util": 0, "mem_used": 1 << 30}
    if gpm:
        dev["gpm"] = {"sm_util": 0.0, "sm_occupancy": 0.0}
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"devices": [dev]}))
    return path
