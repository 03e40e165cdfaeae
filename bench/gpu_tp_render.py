"""The tables of one `bench.gpu_tp` run (a TP collective hang under the daemon): printed by the
harness and written into docs/BENCHMARKS.md by bench/real/report.py, which reads saved runs."""

from __future__ import annotations

import re
from typing import Any

from bench.report import table

GB = 1024**3
_PID = re.compile(r"pid (\d+)")


def per_rank(result: dict[str, Any]) -> list[list[object]]:
    """One row per rank: where its main thread is, whether a collective frame names it, its GPU memory."""
    in_collective = {int(m.group(1)) for f in result["frames"] if (m := _PID.search(f)) and "all_reduce" in f}
    counted = {int(m.group(1)) for f in result["frames"] if (m := _PID.search(f))}
    gpu_by_pid: dict[int, str] = {}
    for proc in result["nvml"].get("processes", []):
        gpu_by_pid[int(proc["pid"])] = f"GPU {proc['gpu_index']}: {int(proc['used_bytes'] or 0) / GB:.1f} GB"
    rows: list[list[object]] = []
    for p in sorted(result["pids"], key=lambda p: (p["rank"] is None, p["rank"] or 0)):
        main = next((w for w in result["waits"] if w["pid"] == p["pid"] and w["tid"] == p["pid"]), None)
        where = f"{main['kind']} in {main['function'] or main['waits_in']}" if main else "?"
        tools = ", ".join(f"{t['tool']} {t['outcome']}" for t in result["tools"] if t["pid"] == p["pid"])
        name = f"TP{p['rank']}" if p["rank"] is not None else p["role"]
        verdict = (
            "all_reduce" if p["pid"] in in_collective else "c10d helper threads only" if p["pid"] in counted else "none"
        )
        rows.append([name, p["pid"], where, verdict, gpu_by_pid.get(p["pid"], "-"), tools])
    return rows


def _s(v: object) -> str:
    return "-" if v is None else f"{float(str(v)):.2f} s"


def _release(result: dict[str, Any]) -> str:
    if result["stopped"].get("gpu_check") == "unavailable":
        return "no NVML on this machine"
    return _s(result["release_after_death_s"])


def missing_note(result: dict[str, Any]) -> str:
    """Where each rank's main thread was, and whether the daemon named the rank the others wait for."""
    threads = "; ".join(f"{r[0]}: {r[2]}" for r in per_rank(result) if str(r[0]).startswith("TP"))
    named = [x for x in result["reasons"] if "never joined" in x]
    if named:
        return f"Main threads: {threads}. The daemon names the rank the others wait for: {named[0]}."
    alone = " (with one rank there is no peer to wait for)" if result["tp_size"] == 1 else ""
    return f"Main threads: {threads}. The daemon named no missing rank{alone}."

def render(result: dict[str, Any]) -> str:
    head = table(
        ["figure", "value"],
        [
            ["backend, ranks", f"{result['backend']}, {result['tp_size']} (rank {result['stalled_rank']} drops out)"],
            ["detection: onset -> `hung`", f"{result['detect_s']:.2f} s"],
            ["cause / class", f"{result['cause']} / {result['hang_class']}"],
            ["bundle (py-spy --native, gdb, every rank)", _s(result["bundle_s"])],
            ["stop: SIGTERM -> tree gone", _s(result["stopped"].get("stop_s"))],
            [
                "NVML release verified",
                f"{result['stopped'].get('gpu_released')} ({result['stopped'].get('gpu_check')})",
            ],
            ["tree gone -> NVML shows it free", _release(result)],
        ],
    )
    ranks = table(["rank", "pid", "main thread", "collective frames in the bundle", "NVML", "tools"], per_rank(result))
    reasons = "\n".join(f"- {r}" for r in result["reasons"])
    frames = "\n".join(f"    {f}" for f in result["frames"])
    return f"{head}\n\n{ranks}\n\nThe bundle's reasons:\n\n{reasons}\n\nand the frames it gives for them:\n\n{frames}"


def ran_section(result: dict[str, Any]) -> str:
    where = "the CPU" if result["backend"] == "gloo" else "one GPU"
    return (
        f"### `python -m bench.gpu_tp --backend {result['backend']} --tp-size {result['tp_size']}` on {where}\n\n"
        f"{result['date']}, {result['machine']}.\n\n{render(result)}\n\n{missing_note(result)}\n"
    )
