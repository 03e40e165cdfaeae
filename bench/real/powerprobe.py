"""Power readings of one GPU at idle, under a spinning kernel and under real work (issue 35's H200
check): `python -m bench.real.powerprobe OUT.json [seconds]`. Three phases of `seconds` each: idle;
`torch.cuda._sleep` (one kernel that spins, what a busy hang leaves resident); back-to-back bf16
matmuls (work). NVML is read every 0.25 s through probes.gpu (power, util) and the enforced limit;
the summary has each phase's median draw and the fraction of the idle-to-limit span the power rule
would compute (supervisor/policy/gpupower.py)."""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any


def main() -> None:
    import pynvml
    import torch

    out, seconds = Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
    rows: list[dict[str, Any]] = []
    phase = ["idle"]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            rows.append({"t": time.time(), "phase": phase[0],
                         "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                         "util": pynvml.nvmlDeviceGetUtilizationRates(h).gpu})
            time.sleep(0.25)

    torch.cuda.init()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(seconds)
    phase[0] = "spin"
    torch.cuda._sleep(int(2e9 * seconds))  # about `seconds` of GPU clock at ~2 GHz: one kernel spinning
    time.sleep(seconds)
    torch.cuda.synchronize()
    phase[0] = "work"
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
    stop.set()
    sampler.join()
    summary: dict[str, Any] = {"limit_w": limit, "name": pynvml.nvmlDeviceGetName(h)}
    idle = statistics.median(r["power_w"] for r in rows if r["phase"] == "idle")
    for name in ("idle", "spin", "work"):
        sel = [r for r in rows if r["phase"] == name][2:]  # the first readings lag the phase change
        if sel:
            p = statistics.median(r["power_w"] for r in sel)
            summary[name] = {"median_w": round(p, 1), "util_median": statistics.median(r["util"] for r in sel),
                             "fraction": round((p - idle) / (limit - idle), 4) if limit > idle else None,
                             "n": len(sel)}
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
