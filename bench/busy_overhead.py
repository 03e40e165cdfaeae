"""Busy hangs at start-up (issue 22): what the two new channels cost per poll.

- GPM: `GpmProbe.observe` (one `nvmlGpmSampleGet` per GPU and one `nvmlGpmMetricsGet` against the
  previous sample) after the GPU probe, per poll, for 1 and 8 GPUs. Real NVML where it loads and
  supports GPM (the H200), else the simulator's GPU (it measures the probe's own cost only; said so).
- py-spy looks: `BusyProbe.sample` (`py-spy dump --nonblocking --full-filenames`, Python frames only,
  in parallel) on 1, 2 and 4 real processes spinning in the simulator's `Event.synchronize`, plus
  the ones it skips (below 0.1 cores). Taken only while CPU is the only channel moving, one per poll.

    .venv/bin/python -m bench.busy_overhead            # prints the table, writes docs/BENCHMARKS.md
    .venv/bin/python -m bench.busy_overhead --polls 50 --no-write
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import ROOT, machine, median, percentile, publish, save_result, stamp
from bench.report import table
from probes.busy import BusyProbe
from probes.gpm import GpmProbe
from probes.gpu import GpuProbe
from supervisor.diagnostics import find_py_spy
from supervisor.simulator.gpu import SimulatedDevice, SimulatedNvml

SPINNER = (
    "from supervisor.simulator.mirror.sglang.srt.speculative.eagle_draft_cuda_graph_runner import "
    "EAGLEDraftCudaGraphRunner\n"
    "class K:\n    finished = False\n"
    "print('spinning', flush=True)\n"
    "EAGLEDraftCudaGraphRunner((1,), lambda bs: K())\n"
)


def _nvml(gpus: int) -> tuple[Any, str]:
    """Real pynvml when it initialises and the GPUs support GPM, else the simulator's GPU with `gpus` GPUs."""
    try:
        import pynvml

        probe = GpuProbe(pynvml)
        obs = probe.observe([])
        if obs.status == "ok" and GpmProbe(pynvml).support(obs)[0]:
            return pynvml, f"real NVML ({len(obs.devices)} x {obs.devices[0].name})"
    except Exception:
        pass
    sim = SimulatedNvml([SimulatedDevice(util=100, gpm={"sm_util": 0.76, "sm_occupancy": 0.01}) for _ in range(gpus)])
    return sim, f"simulated GPU, {gpus} GPU{'s' if gpus > 1 else ''} (the probe's own cost; no driver)"


def gpm_cost(gpus: int, polls: int) -> dict[str, Any]:
    nvml, what = _nvml(gpus)
    gpu = GpuProbe(nvml)
    gpm = GpmProbe(nvml)
    gpm.observe(gpu.observe([]))  # the first sample, paired at the next poll
    gpu_ms, gpm_ms = [], []
    for _ in range(polls):
        t0 = time.perf_counter()
        obs = gpu.observe([])
        t1 = time.perf_counter()
        got = gpm.observe(obs)
        t2 = time.perf_counter()
        assert got.status == "ok" and got.devices, got
        gpu_ms.append((t1 - t0) * 1000)
        gpm_ms.append((t2 - t1) * 1000)
    gpm.close()
    gpu.close()
    return {"what": what, "gpus": len(obs.devices), "gpu_ms": gpu_ms, "gpm_ms": gpm_ms}


@contextmanager
def spinners(n: int) -> Iterator[list[subprocess.Popen[str]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True, env=env) for _ in range(n)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "spinning"
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


def look_cost(n: int, polls: int, spy: str) -> dict[str, Any]:
    probe = BusyProbe(spy, timeout_s=10.0)
    ms: list[float] = []
    waits = 0
    with spinners(n) as procs:
        rates = {p.pid: 1.0 for p in procs}
        for _ in range(polls):
            t0 = time.perf_counter()
            s = probe.sample(rates)
            ms.append((time.perf_counter() - t0) * 1000)
            waits += sum(1 for t in s.threads if t.frames and t.frames[0].function.endswith("synchronize"))
    return {"processes": n, "ms": ms, "threads_in_synchronize": waits}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--polls", type=int, default=30)
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    spy = find_py_spy()
    rows: list[list[object]] = []
    results: dict[str, Any] = {"gpm": [], "looks": []}
    for gpus in (1, 8):
        r = gpm_cost(gpus, a.polls)
        results["gpm"].append(r)
        rows.append(
            [
                f"GPM reading per poll, {r['what']}",
                r["gpus"],
                median(r["gpm_ms"]),
                percentile(r["gpm_ms"], 95),
                f"GPU probe itself: {median(r['gpu_ms']):.3f} ms",
            ]
        )
    if spy is None:
        rows.append(["py-spy look", "-", "-", "-", "py-spy not found: not measured"])
    else:
        for n in (1, 2, 4):
            r = look_cost(n, max(5, a.polls // 3), spy)
            results["looks"].append(r)
            rows.append(
                [
                    f"py-spy look per poll, {n} spinning process{'es' if n > 1 else ''} (in parallel)",
                    n,
                    median(r["ms"]),
                    percentile(r["ms"], 95),
                    f"{r['threads_in_synchronize']} threads seen in synchronize",
                ]
            )
    rows.append(["py-spy look, no process above 0.1 cores", 0, 0.0, 0.0, "skipped: nothing to look at"])
    save_result("busy_overhead", results)
    body = "\n".join(
        [
            "## Busy-hang channels: cost per poll (issue 22)",
            "",
            f"Measured {stamp()} on {machine()}. The machine is shared with other test runs, so timings carry "
            "noise from them. GPM is read every poll in every state; py-spy looks are taken only while "
            "starting and CPU has been the only channel moving for half of `startup_stall_s`.",
            "Reproduce: `.venv/bin/python -m bench.busy_overhead` (on the H200 it uses the real NVML).",
            "",
            table(["measure", "n", "median ms", "p95 ms", "note"], rows),
        ]
    )
    if a.no_write:
        print(body)
    else:
        publish("busy_overhead", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
