"""The daemon's cost while it watches (issue 51, "a cheaper daemon"): CPU % of one core, RSS and
threads of `python -m supervisor run`, shipped intervals idle and under four clients, and 1 s polls
under four clients.

Three daemons run at once, each supervising its own ready simulator (tp 4, `--enable-metrics`, a 1 s
`/health` as SGLang's, the simulated GPU read every poll) with the shipped watchdog intervals (poll
2 s, health every 10 s, /metrics every 5 s) except the third's 1 s poll. Four clients post short
generations back to back (bench/load.py, its own process) to the second and third servers. CPU time
is the daemon's utime+stime from /proc/<pid>/stat, read every 10 s: per-process time, so other work
on the shared machine slows the run but does not bill the daemon. CPU %: the median of the 10 s
windows (and the whole window's mean). Repeated `--runs` times; the table gives min / median of the
runs. `--label before|after` keeps each side's runs in a JSON file (`--store`), and the table shows
both sides when both are there.

    .venv/bin/python -m bench.poll_cost --label after            # 3 runs of 100 s, writes docs/BENCHMARKS.md
    .venv/bin/python -m bench.poll_cost --label before --runs 2 --seconds 90 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import Daemon, Traffic, median, publish, sim_settings, workdir
from bench.report import machine, stamp, table
from supervisor.config.settings import WatchdogSettings

CLK_TCK = os.sysconf("SC_CLK_TCK")
STORE = Path(__file__).resolve().parent / "results" / "poll_cost.json"
CPU_TARGET = 1.0
RSS_TARGET_MB = 80.0
CLIENTS = 4
TP = 4
_SHIPPED = WatchdogSettings()
SHIPPED: dict[str, Any] = {
    k: getattr(_SHIPPED, k)
    for k in (
        "poll_interval_s",
        "startup_stall_s",
        "startup_timeout_s",
        "cpu_only_stall_s",
        "health_interval_s",
        "health_timeout_s",
        "health_failures",
        "serving_stall_s",
        "metrics_interval_s",
        "spec_window_s",
    )
}
ROWS: tuple[tuple[str, float, bool], ...] = (
    ("shipped intervals, idle", SHIPPED["poll_interval_s"], False),
    ("shipped intervals, four clients", SHIPPED["poll_interval_s"], True),
    ("1 s polls, four clients", 1.0, True),
)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


@dataclass
class Run:
    row: str
    cpu_windows: list[float] = field(default_factory=list)  # % of a core per 10 s window
    cpu_mean: float = 0.0
    rss_mb: list[float] = field(default_factory=list)
    threads: int = 0
    seconds: float = 0.0
    requests: int = 0
    error: str = ""

    @property
    def cpu_median(self) -> float:
        return median(self.cpu_windows)


def start(row: str, poll_s: float, wd_name: str) -> Daemon:
    wd = workdir(wd_name)
    s = sim_settings(
        wd,
        "ok",
        tp=TP,
        env={"SGLANG_SIM_HEALTH_LATENCY_S": "1.0", "SGLANG_SIM_IDLE_METRICS_S": "30"},
        watchdog={**SHIPPED, "poll_interval_s": poll_s},
        gpu_file=wd / "gpu.json",
    )
    return Daemon(s, wd).start()


def one_run(seconds: float, step_s: float = 10.0) -> list[Run]:
    daemons = [start(name, poll, f"pollcost-{i}") for i, (name, poll, _) in enumerate(ROWS)]
    runs = [Run(name) for name, _, _ in ROWS]
    traffic: list[Traffic] = []
    try:
        for d, (name, _, _) in zip(daemons, ROWS, strict=True):
            d.wait(lambda x: x["state"] == "ready", 180, f"ready ({name})")
        for d, (_, _, loaded) in zip(daemons, ROWS, strict=True):
            if loaded:
                traffic.append(Traffic(d.settings.server.port, concurrency=CLIENTS, seconds=seconds + 60).__enter__())
        time.sleep(8)  # past the first polls under load
        t0 = time.monotonic()
        last_t = t0
        c0 = [cpu_seconds(d.pid) for d in daemons]
        last_c = list(c0)
        while time.monotonic() - t0 < seconds:
            time.sleep(step_s)
            now = time.monotonic()
            for i, (d, r) in enumerate(zip(daemons, runs, strict=True)):
                c = cpu_seconds(d.pid)
                r.cpu_windows.append(round(100 * (c - last_c[i]) / (now - last_t), 3))
                r.rss_mb.append(round(status_kb(d.pid, "VmRSS") / 1024, 1))
                last_c[i] = c
            last_t = now
        elapsed = time.monotonic() - t0
        for i, (d, r) in enumerate(zip(daemons, runs, strict=True)):
            r.seconds = round(elapsed, 1)
            r.cpu_mean = round(100 * (cpu_seconds(d.pid) - c0[i]) / elapsed, 3)
            r.threads = len(os.listdir(f"/proc/{d.pid}/task"))
            st = d.status() or {}
            if st.get("state") != "ready" or st.get("incidents", 0):
                r.error = f"state {st.get('state')}, incidents {st.get('incidents')}"
    finally:
        for t in traffic:
            t.__exit__(None, None, None)
        for d in daemons:
            d.stop()
    loaded_runs = [r for r, (_, _, loaded) in zip(runs, ROWS, strict=True) if loaded]
    for r, t in zip(loaded_runs, traffic, strict=True):
        r.requests = int(t.summary.get("ok", 0))
    return runs


def _fmt(vals: list[float], unit: str = "", digits: int = 2) -> str:
    if not vals:
        return "-"
    return f"{min(vals):.{digits}f} / {median(vals):.{digits}f}{unit}"


def cells(runs: list[dict[str, Any]]) -> list[str]:
    """CPU (min / median over the runs of each run's whole window), RSS MB (min / median of the runs'
    medians), threads (the most seen)."""
    if not runs:
        return ["-", "-", "-"]
    cpu = [r["cpu_mean"] for r in runs]
    rss = [median(r["rss_mb"]) for r in runs]
    return [_fmt(cpu, " %"), _fmt(rss, digits=1), str(max(r["threads"] for r in runs))]


def render(store: dict[str, Any]) -> str:
    before, after = store.get("before", {}), store.get("after", {})
    rows = []
    for name, _, _ in ROWS:
        b = [r for run in before.get("runs", []) for r in run if r["row"] == name]
        a = [r for run in after.get("runs", []) for r in run if r["row"] == name]
        ok_cpu = bool(a) and median([r["cpu_mean"] for r in a]) < CPU_TARGET
        ok_rss = bool(a) and median([median(r["rss_mb"]) for r in a]) < RSS_TARGET_MB
        rows.append([name, *cells(b), *cells(a), "met" if ok_cpu and ok_rss else "NOT met"])
    info = "; ".join(
        f"{side}: {store[side]['stamp']}, {store[side]['commit']}, {len(store[side]['runs'])} runs of "
        f"{store[side]['seconds']:g} s"
        for side in ("before", "after")
        if side in store
    )
    cols = ["row", "before CPU", "before RSS MB", "thr", "after CPU", "after RSS MB", "thr", "target"]
    return "\n".join(
        [
            "## The daemon's cost while it watches: CPU, RSS, threads (issue 51)",
            "",
            f"Measured on {machine()} (2 shared cores; other engineers' tests ran beside it). {info}.",
            "Reproduce: `.venv/bin/python -m bench.poll_cost --label after` (`--label before` on the "
            "older commit; both sides are kept in `bench/results/poll_cost.json`).",
            "",
            f"Three daemons at once, each watching its own ready simulator (tp {TP}, `--enable-metrics`, "
            "1 s `/health`, the simulated GPU read every poll), shipped intervals (poll 2 s, health every "
            f"10 s, /metrics every 5 s) except the last row's 1 s poll; {CLIENTS} clients post generations "
            "back to back to the loaded rows' servers. CPU: % of one core from the daemon's utime+stime in "
            "/proc over each run's whole window (per-process time: a loaded machine does not bill the daemon; "
            "10 s windows, also kept, count in 0.1 % steps at 100 ticks a second); each cell is min / median "
            "over the runs. RSS: VmRSS, median of the 10 s "
            f"samples. Target: under {CPU_TARGET:g} % of a core and under {RSS_TARGET_MB:g} MB.",
            "",
            table(cols, rows),
        ]
    )


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "supervisor", "probes"], capture_output=True, text=True
        )
        return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--label", choices=("before", "after"), default="after")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=100.0, help="measured window per run (after ready)")
    p.add_argument("--store", type=Path, default=STORE)
    p.add_argument("--no-write", action="store_true", help="print the table; leave docs/BENCHMARKS.md alone")
    p.add_argument("--render-only", action="store_true", help="redraw the table from the store")
    a = p.parse_args(argv)
    store: dict[str, Any] = json.loads(a.store.read_text()) if a.store.exists() else {}
    if not a.render_only:
        runs = []
        for i in range(a.runs):
            got = one_run(a.seconds)
            for r in got:
                print(
                    f"run {i + 1} {r.row}: cpu median {r.cpu_median:.2f} % mean {r.cpu_mean:.2f} % "
                    f"rss {median(r.rss_mb):.1f} MB threads {r.threads} requests {r.requests} {r.error}",
                    flush=True,
                )
            runs.append([asdict(r) for r in got])
        store[a.label] = {"stamp": stamp(), "commit": commit(), "seconds": a.seconds, "runs": runs}
        a.store.parent.mkdir(parents=True, exist_ok=True)
        a.store.write_text(json.dumps(store, indent=1) + "\n")
    body = render(store)
    if a.no_write:
        print(body)
    else:
        publish("poll_cost", body)
    bad = [r for run in store.get(a.label, {}).get("runs", []) for r in run if r.get("error")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
