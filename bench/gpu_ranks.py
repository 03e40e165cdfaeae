"""Eight ranks at one instant: the capture of an eight-rank tree by the daemon's diagnostics code.

    python -m bench.gpu_ranks --write-docs                 # the H200 (one GPU: eight ranks share it)
    python -m bench.gpu_ranks --cpu                        # any machine: the simulator's eight ranks, no GPU
    python -m bench.gpu_ranks --cpu --spin                 # any machine: eight ranks spinning in Python

Eight processes (bench/gpuserver/busy_ranks.py, titled `sglang::scheduler_TP0..7`) each hold GPU
memory and keep a `torch.cuda._sleep` kernel running; `supervisor.diagnostics.capture` reads all of
them as the daemon does on a hung verdict (py-spy --native, then cuda-gdb where the process holds
GPU memory, gdb otherwise; NVML snapshot). Reported: the bundle time (target < 15 s), the spread
between the first and last rank's first sample (`sampling.rank_spread_s`), the slowest tool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.gpuserver.measure import find_gdb, find_py_spy
from bench.report import machine, stamp, table, write_section
from probes.gpu import GpuProbe
from probes.proctree import MARKER_ENV, ProcessTreeProbe
from supervisor.diagnostics import CaptureRequest, capture
from supervisor.process import kill_marked, resume_stopped

ROOT = Path(__file__).resolve().parents[1]

TARGET_S = 15.0


def start_sim(args: argparse.Namespace, work: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """The SGLang simulator with `--tp-size N`, deadlocked after load: N `sglang::scheduler_TPn` ranks."""
    marker = f"ranks-{uuid.uuid4().hex[:12]}"
    onset = work / "onset.json"
    env = {
        **os.environ,
        "SGLANG_SIM_SCENARIO": "deadlock_after_load",
        "SGLANG_SIM_PACE": "0.1",
        "SGLANG_SIM_ONSET_FILE": str(onset),
        MARKER_ENV: marker,
    }
    argv = [args.python, "-m", "supervisor.simulator", "--model-path", str(work / "model"),
            "--tp-size", str(args.ranks), "--port", "0"]
    log = open(work / "ranks.log", "wb")  # noqa: SIM115 - handed to the child
    root = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    deadline = time.monotonic() + args.start_timeout
    probe = ProcessTreeProbe()
    while time.monotonic() < deadline and root.poll() is None:
        ranks = [p for p in probe.observe(root.pid, marker).processes if p.role == "scheduler"]
        if onset.exists() and len(ranks) >= args.ranks:
            time.sleep(1.0)  # every rank reaches its deadlock (the onset file is rank 0's)
            return root, marker, onset
        time.sleep(0.2)
    raise RuntimeError(f"the simulator's ranks did not start: {(work / 'ranks.log').read_text()[-2000:]}")


def start(args: argparse.Namespace, work: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    if args.cpu and not args.spin:
        return start_sim(args, work)
    marker = f"ranks-{uuid.uuid4().hex[:12]}"
    ready = work / "ready"
    ready.mkdir(parents=True, exist_ok=True)
    argv = [args.python, "-m", "bench.gpuserver.busy_ranks", "--ranks", str(args.ranks), "--gb", str(args.gb)]
    argv += ["--ready", str(ready), *(["--cpu"] if args.cpu else [])]
    env = {**os.environ, MARKER_ENV: marker, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    log = open(work / "ranks.log", "wb")  # noqa: SIM115 - handed to the child
    root = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    deadline = time.monotonic() + args.start_timeout
    while len(list(ready.iterdir())) < args.ranks:
        if root.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the ranks did not start: {(work / 'ranks.log').read_text()[-2000:]}")
        time.sleep(0.2)
    return root, marker, ready


async def capture_once(args: argparse.Namespace, root: int, marker: str, diag: Path, n: int) -> dict[str, Any]:
    procs = ProcessTreeProbe().observe(root, marker).processes
    gpu = GpuProbe().snapshot_all()  # the real NVML
    req = CaptureRequest(
        incident_id=f"ranks-{args.ranks}-{n}",
        trigger="hung",
        cause="serving_stall",
        processes=procs,
        native=True,
        gdb=not args.no_gdb,
        py_spy_timeout_s=20.0,
        gdb_timeout_s=60.0,
        budget_s=60.0,
        gpu=gpu,
    )
    res = await capture(
        req, diag, keep=100, max_bytes=2**32, py_spy_path=find_py_spy(), gdb_path=args.gdb, resume=resume_stopped
    )
    sampling = res.summary.get("sampling", {})
    assert isinstance(sampling, dict)
    tools: dict[str, list[float]] = {}
    for t in res.tools:
        tools.setdefault(f"{t.tool} {t.outcome}", []).append(t.duration_s)
    ranks = [p for p in procs if p.role == "scheduler"]
    return {
        "bundle_s": round(res.duration_s, 3),
        "rank_spread_s": sampling.get("rank_spread_s"),
        "ranks": len(ranks),
        "processes": len(procs),
        "hang_class": res.hang_class,
        "tools": {k: [len(v), round(max(v), 3)] for k, v in sorted(tools.items())},
        "gpu": gpu.status,
        "tree_mem_gb": round(sum(p.used_bytes for p in gpu.processes if p.pid in {r.pid for r in ranks}) / 1024**3, 1),
        "path": str(res.path),
    }


def render(result: dict[str, Any]) -> str:
    runs = result["runs"]
    rows = [
        [
            i + 1,
            r["ranks"],
            f"{r['bundle_s']:.2f}",
            "-" if r["rank_spread_s"] is None else f"{r['rank_spread_s']:.3f}",
            r["hang_class"],
            "; ".join(f"{k} x{n} max {m:.2f} s" for k, (n, m) in r["tools"].items()),
        ]
        for i, r in enumerate(runs)
    ]
    worst = max(r["bundle_s"] for r in runs)
    return "\n".join(
        [
            f"## Eight ranks at one instant ({result['mode']})",
            "",
            f"Measured {result['stamp']} on {result['machine']}. Reproduce: `python -m bench.gpu_ranks"
            f"{ {'gpu': '', 'cpu': ' --cpu', 'cpu-spin': ' --cpu --spin'}[result['mode']] } --write-docs`.",
            "",
            f"{result['ranks']} processes titled `sglang::scheduler_TP0..{result['ranks'] - 1}`, each "
            + {"gpu": "holding GPU memory with a `torch.cuda._sleep` kernel running",
               "cpu": "a rank of the SGLang simulator deadlocked after load (no GPU, no cuda-gdb)",
               "cpu-spin": "spinning in Python (no GPU, no cuda-gdb)"}[result["mode"]]
            + f", captured by `supervisor.diagnostics.capture` (py-spy --native, {result['debugger']}). "
            f"Bundle: median {statistics.median(r['bundle_s'] for r in runs):.2f} s, worst {worst:.2f} s "
            f"(target < {TARGET_S:g} s: {'met' if worst < TARGET_S else 'NOT met'}); spread between the first "
            "and last rank's first sample in the last column but one.",
            "",
            table(["run", "ranks", "bundle s", "rank spread s", "class", "tools (count, slowest)"], rows),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--gb", type=float, default=2.0, help="GPU memory per rank")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="no GPU: the simulator's ranks (gdb where installed)")
    p.add_argument("--spin", action="store_true", help="with --cpu: eight ranks spinning in Python instead")
    p.add_argument("--no-gdb", action="store_true")
    p.add_argument("--python", default=sys.executable, help="the interpreter that has torch")
    p.add_argument("--gdb", default=None, help="debugger path (default: cuda-gdb where installed, else gdb)")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--out", default=None, help="directory for gpu_ranks.json and the bundles")
    p.add_argument("--write-docs", action="store_true", help="write the docs/BENCHMARKS.md section")
    a = p.parse_args(argv)
    if a.gdb is None:
        a.gdb = find_gdb()
    work = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="gpu-ranks-"))
    work.mkdir(parents=True, exist_ok=True)
    root, marker, _ = start(a, work)
    runs = []
    try:
        for n in range(a.reps):
            r = asyncio.run(capture_once(a, root.pid, marker, work / "diagnostics", n))
            print(json.dumps(r), flush=True)
            runs.append(r)
    finally:
        kill_marked(marker, grace_s=2.0)
        root.wait(30)
    result = {
        "mode": ("cpu-spin" if a.spin else "cpu") if a.cpu else "gpu",
        "ranks": a.ranks,
        "debugger": "no debugger" if a.no_gdb else Path(a.gdb).name if a.gdb else "no debugger installed",
        "stamp": stamp(),
        "machine": machine(),
        "runs": runs,
    }
    (work / "gpu_ranks.json").write_text(json.dumps(result, indent=1))
    text = render(result)
    print(text)
    if a.write_docs:
        write_section(f"gpu_ranks_{result['mode']}", text)
    return 0 if max(r["bundle_s"] for r in runs) < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
