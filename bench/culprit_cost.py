"""The culprit first (issue 35): what the Flight Recorder and the culprit ranking add to a hang's capture.

- Flight Recorder as a hang's capture runs it: `flight_dumps` before any debugger attaches (every
  rank's pipe written, the wait for the dumps: its wall time adds to the capture's), then
  `flight_read` alongside the tools (the dumps read by the server's Python with the class-refusing
  loader; torch's analyzer runs after the bundle since 2026-12-06, so the read is the standard
  library's alone, `FR_ANALYZER_AFTER_BUNDLE` as in a capture: it adds only where it outlasts the
  tools). Ranks
  are stand-ins that do what ProcessGroupNCCL's monitor does with `TORCH_NCCL_DUMP_ON_TIMEOUT=1`:
  read the pipe once a second (torch's cadence) and dump a ring of 2,000 entries; with torch
  installed, two real gloo ranks dump torch's own ring (they have dumped once before the hang:
  torch 2.13's first dump in a process imports torch._inductor for its symbolizer, seconds here). A tree
  with no pipe (the simulator, a server
  without torch.distributed) costs one directory listing.
- Culprit ranking: `culprits()` over 8 ranks of 40 threads each (the 38-thread scheduler of the
  H200 LOCK_GIL run), pure.

    .venv/bin/python -m bench.culprit_cost              # prints the table, writes docs/BENCHMARKS.md
    .venv/bin/python -m bench.culprit_cost --reps 3 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import median, percentile, publish, save_result
from bench.report import machine, stamp, table
from probes.types import ThreadInfo
from supervisor.diagnostics import Evidence, Frame, ProcEvidence, StackThread
from supervisor.diagnostics.capture import FR_ANALYZER_AFTER_BUNDLE
from supervisor.diagnostics.culprit import culprits
from supervisor.diagnostics.flightrec import (
    DUMP_KEY,
    ON_TIMEOUT_KEY,
    PIPE_KEY,
    flight_dumps,
    flight_read,
    flight_record,
)

# A rank's Flight Recorder as torch keeps it: the pipe read once a second, the ring dumped as a pickle.
STAND_IN = r"""
import os, pickle, sys, time
rank, last = int(sys.argv[1]), int(sys.argv[2])
pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + f"{rank}.pipe"
out = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + f"{rank}"
os.mkfifo(pipe)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
ring = [{"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": i,
         "p2p_seq_id": 0, "op_id": i, "profiling_name": "nccl:all_reduce", "time_created_ns": 0,
         "input_sizes": [[4096]], "output_sizes": [[4096]], "is_p2p": False,
         "state": "scheduled" if i == last else "completed",
         "frames": [{"name": "all_reduce", "filename": "distributed_c10d.py", "line": 2501}] * 8}
        for i in range(max(1, last - 1999), last + 1)]
print("ready", flush=True)
while True:
    time.sleep(1.0)
    try:
        data = os.read(fd, 64)
    except BlockingIOError:
        data = b""
    if data:
        with open(out + ".tmp", "wb") as f:
            pickle.dump({"version": "2.10", "pg_config": {"0": {"ranks": "[]"}}, "entries": ring}, f)
        os.rename(out + ".tmp", out)
"""

TORCH_RANK = r"""
import os, sys, time, torch, torch.distributed as dist
rank, store = int(sys.argv[1]), sys.argv[2]
pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + f"{rank}.pipe"
out = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + f"{rank}"
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
for _ in range(50):
    dist.all_reduce(torch.ones(64))
pending = dist.all_reduce(torch.ones(64), async_op=True) if rank == 0 else None
torch._C._distributed_c10d._dump_fr_trace()  # the first dump imports torch._inductor (its symbolizer)
os.mkfifo(pipe)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
print("ready", flush=True)
while True:
    time.sleep(1.0)
    try:
        data = os.read(fd, 64)
    except BlockingIOError:
        data = b""
    if data:
        with open(out + ".tmp", "wb") as f:
            f.write(torch._C._distributed_c10d._dump_fr_trace())
        os.rename(out + ".tmp", out)
"""


@contextmanager
def ranks(argvs: list[list[str]], env: dict[str, str]) -> Iterator[list[int]]:
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, text=True, env=env) for a in argvs]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


def fr_env(folder: str) -> dict[str, str]:
    return {
        **os.environ,
        PIPE_KEY: os.path.join(folder, "pipe_rank_"),
        DUMP_KEY: os.path.join(folder, "nccl_trace_rank_"),
        ON_TIMEOUT_KEY: "1",
        "TORCH_FR_BUFFER_SIZE": "2000",
    }


def fr_cost(n: int, reps: int, torch_ranks: bool) -> dict[str, Any]:
    """Wall time of `flight_dumps` (before the tools) and `flight_read` (beside them) over `n` ranks."""
    wall, read_s, statuses = [], [], []
    for _ in range(reps):
        with tempfile.TemporaryDirectory(prefix="fr-bench-") as d:
            env = fr_env(d)
            if torch_ranks:
                store = os.path.join(d, "store")
                argvs = [[sys.executable, "-c", TORCH_RANK, str(r), store] for r in range(n)]
            else:
                argvs = [[sys.executable, "-c", STAND_IN, str(r), str(5000 if r else 5001)] for r in range(n)]
            with ranks(argvs, env) as pids:
                t0 = time.perf_counter()
                got = asyncio.run(flight_dumps(env, 5.0))
                t1 = time.perf_counter()
                rep = asyncio.run(flight_read(got, env, pids, [sys.executable], FR_ANALYZER_AFTER_BUNDLE))
                wall.append(t1 - t0)
                read_s.append(time.perf_counter() - t1)
            statuses.append(f"{rep.status}:{rep.verdict.mismatch if rep.verdict else '-'}")
    return {"ranks": n, "torch": torch_ranks, "dumps_s": wall, "read_s": read_s, "status": sorted(set(statuses))}


def no_pipe_cost(reps: int) -> list[float]:
    out = []
    with tempfile.TemporaryDirectory(prefix="fr-bench-") as d:
        env = fr_env(d)
        for _ in range(reps):
            t0 = time.perf_counter()
            rep = asyncio.run(flight_record(env, [], [sys.executable], 5.0))
            out.append((time.perf_counter() - t0) * 1000)
            assert rep.status == "nothing", rep
    return out


def evidence(ranks_n: int, threads: int) -> Evidence:
    procs = []
    for r in range(ranks_n):
        pid = 1000 * (r + 1)
        main = StackThread(
            pid,
            "MainThread",
            (
                Frame("init_attention_backends", "sitecustomize.py", 27),
                Frame("ModelRunner.__init__", "model_runner.py", 300),
            ),
            "idle+gil",
        )
        helpers = [
            StackThread(
                pid + i, name, (Frame("run", f"{name}/loop.py", 10), Frame("wait", "threading.py", 331)), "idle"
            )
            for i, name in (
                (i, ("pt_gloo_runloop", "tqdm_monitor", "ZMQbg", "pt_nccl_watchdg")[i % 4]) for i in range(1, threads)
            )
        ]
        sample = tuple(ThreadInfo(t.tid or 0, t.name[:15], "S", "futex_do_wait") for t in (main, *helpers))
        procs.append(
            ProcEvidence(pid, "scheduler", r, f"sglang::scheduler_TP{r}", (sample, sample), python=(main, *helpers))
        )
    return Evidence(tuple(procs))


def ranking_cost(reps: int) -> list[float]:
    ev = evidence(8, 40)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        named = culprits(ev, 30.0)
        out.append((time.perf_counter() - t0) * 1000)
        assert named[0].thread == "MainThread" and named[0].helpers == 39, named[0]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    rows: list[list[object]] = []
    results: dict[str, Any] = {"fr": []}
    none_ms = no_pipe_cost(a.reps * 4)
    results["no_pipe_ms"] = none_ms
    rows.append(
        [
            "FR, no rank has a pipe (the simulator; no torch.distributed)",
            0,
            median(none_ms) / 1000,
            percentile(none_ms, 95) / 1000,
            "status nothing: no wait",
        ]
    )
    for n in (1, 2, 8):
        r = fr_cost(n, a.reps, torch_ranks=False)
        results["fr"].append(r)
        note = f"{', '.join(r['status'])}; read beside the tools {median(r['read_s']):.2f} s"
        rows.append(
            [
                f"FR, {n} stand-in rank(s), pipe read once a second",
                n,
                median(r["dumps_s"]),
                percentile(r["dumps_s"], 95),
                note,
            ]
        )
    try:
        import torch

        r = fr_cost(2, a.reps, torch_ranks=True)
        results["fr"].append(r)
        note = f"{', '.join(r['status'])}; torch {torch.__version__}; read beside the tools {median(r['read_s']):.2f} s"
        rows.append(
            [
                "FR, 2 real torch gloo ranks (CPU), one never entering",
                2,
                median(r["dumps_s"]),
                percentile(r["dumps_s"], 95),
                note,
            ]
        )
    except ImportError:
        rows.append(["FR, real torch ranks", "-", "-", "-", "torch not installed: not measured"])
    rank_ms = ranking_cost(a.reps * 20)
    results["ranking_ms"] = rank_ms
    rows.append(
        [
            "culprit ranking, 8 ranks x 40 threads (pure)",
            320,
            median(rank_ms) / 1000,
            percentile(rank_ms, 95) / 1000,
            "added to every hang's summary",
        ]
    )
    save_result("culprit_cost", results)
    body = "\n".join(
        [
            "## The culprit first: what FR and the ranking add to a capture (issue 35)",
            "",
            f"Measured {stamp()} on {machine()}. The machine is shared with other test runs, so timings carry "
            "noise from them. The Flight Recorder's pipes and wait run before any debugger attaches, so their "
            "wall time (the table's seconds) adds to the capture's; reading the dumps runs beside the tools. "
            "The wait ends as soon as every written pipe's dump has arrived and stopped growing (0.3 s), "
            "bounded by `flight_recorder_wait_s` (5 s). torch reads the pipe once a second, so about "
            "0.5-1.3 s of it is torch's cadence; the field report's 24 ranks took 3.4 s.",
            "Reproduce: `.venv/bin/python -m bench.culprit_cost` (the torch row needs `pip install torch==2.13.0`).",
            "",
            table(["measure", "n", "median s", "p95 s", "note"], rows),
        ]
    )
    if a.no_write:
        print(body)
    else:
        publish("culprit_cost", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
