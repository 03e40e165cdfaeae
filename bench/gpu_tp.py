"""A tensor-parallel collective hang under the daemon: per-rank evidence, the missing rank, the release (issue 11).

    python -m bench.gpu_tp --backend nccl --tp-size 2 --write-docs      # a machine with >= 2 GPUs
    python -m bench.gpu_tp --backend gloo --tp-size 2 --python /tmp/torchvenv/bin/python   # CPU only

Runs `bench/gpuserver/tp.py` (one process per rank, `sglang::scheduler_TP{n}`, all-reduces in a loop)
under the daemon, in-process, with the last rank told to stop taking part after a few steps. The
daemon must call it a `startup_stall`, classify it `collective` from the ranks' frames, capture every
rank, stop the tree and (with NCCL) see every GPU's memory released. `--python` names the
interpreter that has torch, when the daemon's own has none (torch is no dependency of the project).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

from bench.gpu_tp_render import render
from bench.gpuserver.harness import events, free_port, start_daemon, wait_file
from bench.gpuserver.measure import ReleaseWatch, device_used, find_gdb, find_py_spy
from bench.gpuserver.tp import NO_MULTICAST
from bench.real import report
from bench.report import machine, stamp
from probes.gpu import GpuProbe
from supervisor.config.settings import Settings, settings_from_mapping

ROOT = Path(__file__).resolve().parents[1]


def tp_settings(work: Path, args: argparse.Namespace) -> Settings:
    stall_rank = args.tp_size - 1
    return settings_from_mapping(
        {
            "server": {
                "command": [args.python, "-m", "bench.gpuserver.tp"],
                "port": free_port(),
                "cwd": str(ROOT),
                "env": {
                    "GPU_TP_STALL_RANK": str(stall_rank),
                    "GPU_TP_STALL_AFTER": "10",
                    "GPU_TP_ONSET_FILE": str(work / "onset.json"),
                    "GPU_TP_WEIGHTS_GB": str(args.weights_gb),
                    **NO_MULTICAST,
                },
                "args": {"model-path": "/models/gpu-tp", "tp-size": args.tp_size, "backend": args.backend},
            },
            "watchdog": {"poll_interval_s": 0.5, "startup_stall_s": 5.0, "cpu_only_stall_s": 10.0},
            "restart": {"retries_per_rung": 0, "stop_grace_s": 2.0, "release_timeout_s": 30.0},
            "diagnostics": {
                "native": True,
                "gdb": "on_hang",
                "gdb_timeout_s": 90.0,
                "py_spy_path": find_py_spy(),
                "gdb_path": find_gdb(),
            },
            "api": {"port": free_port()},
            "paths": {"state_dir": str(work / "state")},
        }
    )


async def run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    settings = tp_settings(work, args)
    probe = GpuProbe()  # the real NVML: the ranks' GPUs
    baseline = device_used(probe)
    daemon = await start_daemon(settings)
    watch = None
    try:
        onset = await wait_file(work / "onset.json", lambda d: d.get("onset_wall") is not None, 300)
        snap = await daemon.wait_for(lambda s: s.state in ("hung", "diagnosing", "failed"), 120, "the verdict")
        pids = [p.pid for p in snap.processes]
        watch = ReleaseWatch(probe, pids, baseline).start()
        snap = await daemon.wait_for(lambda s: s.state == "failed", 300, "stop after the incident")
    finally:
        await daemon.stop()
    release = await asyncio.to_thread(watch.join, 60.0) if watch is not None else None
    ev = events(settings.state_dir)
    inc = snap.last_incident
    hung = next(e for e in ev if e["event"] == "state_changed" and e.get("new") == "hung")
    bundle = settings.state_dir / "diagnostics" / (inc.bundle if inc and inc.bundle else "-")
    summary = json.loads((bundle / "summary.json").read_text()) if (bundle / "summary.json").exists() else {}
    nvml = json.loads((bundle / "nvml.json").read_text()) if (bundle / "nvml.json").exists() else {}
    from datetime import datetime

    return {
        "date": stamp(),
        "machine": machine(),
        "backend": args.backend,
        "tp_size": args.tp_size,
        "stalled_rank": onset.get("rank"),
        "cause": inc.cause if inc else None,
        "hang_class": inc.hang_class if inc else None,
        "detect_s": datetime.fromisoformat(hung["ts"].replace("Z", "+00:00")).timestamp() - onset["onset_wall"],
        "reasons": summary.get("reasons", []),
        "frames": summary.get("frames", []),
        "pids": summary.get("pids", []),
        "tools": summary.get("tools", []),
        "waits": summary.get("waits", []),
        "nvml": nvml,
        "bundle_s": next((e["duration_s"] for e in ev if e["event"] == "bundle_written"), None),
        "stopped": next((e for e in ev if e["event"] == "server_stopped"), {}),
        "release_after_death_s": release.after_death_s if release else None,
        "bundle": str(bundle),
    }


def write_docs(results: list[dict[str, Any]]) -> None:
    """The multi-GPU section holds this harness and real SGLang's tp-2 runs together: bench/real/report.py
    keeps both in one saved copy and writes the section from it."""
    report.with_harness(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--tp-size", type=int, default=2)
    parser.add_argument("--weights-gb", type=float, default=20.0, help="per rank, on its GPU (NCCL only)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with torch, for the ranks")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--write-docs", action="store_true", help="write the `multi-gpu` section of docs/BENCHMARKS.md")
    parser.add_argument("--render", type=Path, nargs="+", default=None, help="write the section from saved gpu_tp.json")
    args = parser.parse_args(argv)
    if args.render is not None:
        results = [json.loads(p.read_text()) for p in args.render]
        write_docs(results)
        print("\n\n".join(render(r) for r in results))
        return 0
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    os.environ.update(NO_MULTICAST)
    work = Path(tempfile.mkdtemp(prefix="gpu-tp-"))
    started = time.monotonic()
    result = asyncio.run(run(work, args))
    print(render(result))
    print(f"\n(bundle {result['bundle']}; {time.monotonic() - started:.1f} s)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_tp.json").write_text(json.dumps(result, indent=1, default=str))
    if args.write_docs:
        write_docs([result])
    return 0 if result["hang_class"] == "collective" else 1


if __name__ == "__main__":
    sys.exit(main())
