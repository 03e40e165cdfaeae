"""What the simulated server does to its GPU: the JSON file of the simulated NVML (nvml.py).

When the simulator's `SGLANG_SIM_GPU_FILE` names that file (the daemon reads the same one under
`[gpu] source = "simulator"`), a never-ending kernel shows there as a real one did on the H200: NVML
utilisation 100 % and GPM SM activity 0.76 %, occupancy 0.01 % (REAL_SGLANG.md). The file's earlier
readings are kept beside them and put back when the next server launches (the kernel dies with its
process). Without the variable nothing is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

SPIN_UTIL = 100.0
SPIN_SM_UTIL = 0.76  # percent, as NVML GPM reports it
SPIN_SM_OCCUPANCY = 0.01
SPIN_POWER_ABOVE_IDLE = 0.03  # of the way from idle to the limit: one resident kernel doing no work
_SAVED = "simulator_saved"  # the devices' readings before the spin


class SpinningKernel:
    """A kernel that never finishes; launching it makes the simulated GPU look busy and idle at once."""

    finished = False

    def __init__(self, nvml_file: str | None) -> None:
        if nvml_file:
            spin(nvml_file)


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("devices"), list) else None


def _write(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".sim-gpu-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def create(path: Path, gpus: int) -> None:
    """A simulated GPU file with `gpus` idle H200s (the demo's; tests write their own)."""
    devices = [{"uuid": f"GPU-sim-{i}", "name": "NVIDIA H200 (simulated)", "util": 0} for i in range(gpus)]
    for dev in devices:
        dev["gpm"] = {"sm_util": 0.0, "sm_occupancy": 0.0}
    _write(path, {"devices": devices})


def spin(nvml_file: str) -> None:
    path = Path(nvml_file)
    data = _load(path)
    if data is None:
        return
    if _SAVED not in data:
        data[_SAVED] = [
            {k: d.get(k) for k in ("util", "gpm", "power_w")} for d in data["devices"] if isinstance(d, dict)
        ]
    saved = data[_SAVED] if isinstance(data[_SAVED], list) else []
    for dev, before in zip(data["devices"], [*saved, *([{}] * len(data["devices"]))], strict=False):
        if isinstance(dev, dict):
            dev["util"] = SPIN_UTIL
            if "gpm" in dev:  # a GPU without GPM (A100, L40S, MIG) stays without it
                dev["gpm"] = {"sm_util": SPIN_SM_UTIL, "sm_occupancy": SPIN_SM_OCCUPANCY}
            # from the reading before the first spin: a second kernel of the tree adds nothing
            power = before.get("power_w") if isinstance(before, dict) else None
            limit = dev.get("power_limit_w")
            if isinstance(power, int | float) and isinstance(limit, int | float):
                dev["power_w"] = power + SPIN_POWER_ABOVE_IDLE * (limit - power)
    _write(path, data)


def settle(nvml_file: str | None) -> None:
    """A new server launches: the old tree's kernels are gone, its readings come back."""
    if not nvml_file:
        return
    path = Path(nvml_file)
    data = _load(path)
    if data is None or _SAVED not in data:
        return
    saved = data.pop(_SAVED)
    for dev, before in zip(data["devices"], saved if isinstance(saved, list) else [], strict=False):
        if isinstance(dev, dict) and isinstance(before, dict):
            for key, value in before.items():
                if value is None:
                    dev.pop(key, None)
                else:
                    dev[key] = value
    _write(path, data)
