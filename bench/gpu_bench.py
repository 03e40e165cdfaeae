"""The daemon on a real GPU: NVML attribution, an idle and a busy hang found, captured, stopped and released.

One script, every step, one table (issue 10). On the GPU machine, from the repository root:

    python -m bench.gpu_bench --out $OUT --write-docs

Steps: (e) the server comes up under the daemon and `/status` attributes its GPU memory to the tree;
(a) the NVML probe's per-process memory and its cost per poll; (b) an idle deadlock after a 40 GB
load and (c) a GPU kernel spinning on a flag, each detected by the daemon, classified, captured
(py-spy --native and cuda-gdb), stopped and the release verified; (d) the same two hangs captured
without the daemon, with and without cuda-gdb, then SIGKILLed with the GPU release timed.
`--device cpu` runs the same steps on host memory, to check the harness where there is no GPU
(NVML then reports unavailable; `--simulated-gpu FILE` reads the simulator's GPU instead, as
`[gpu] source = "simulator"` does).
`--render FILE` writes the docs section from a saved result file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import structlog

from bench.gpuserver.direct import run_direct
from bench.gpuserver.harness import RunConfig, gdb_facts, run_hang, run_serve
from bench.gpuserver.measure import find_gdb, find_py_spy
from bench.report import machine, stamp, table, write_section
from supervisor.config.gpu import GpuSettings

GB = 1024**3


def _jsonable(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        data = asdict(obj)
        for name in ("after_death_s",):
            if hasattr(obj, name):
                data[name] = getattr(obj, name)
        if hasattr(obj, "release"):
            data["release"] = _jsonable(obj.release)
        return data
    return obj


def _gpu_facts() -> dict[str, str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as err:
        return {"gpu": f"no NVML ({err})", "driver": "-", "gpus": "0"}

    def text(v: object) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    return {"gpu": f"{text(name)}, {total / GB:.0f} GiB", "driver": text(driver), "gpus": str(count)}


def _versions(*exes: str) -> str:
    """First line of each `--version`, skipping the `exec: ...` line cuda-gdb's wrapper script prints."""
    out = []
    for exe in exes:
        try:
            run = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30, check=False)
            lines = [x for x in (run.stdout + run.stderr).splitlines() if x.strip() and not x.startswith("exec:")]
            out.append(lines[0] if lines else f"{exe}: ?")
        except (OSError, subprocess.TimeoutExpired):
            out.append(f"{exe}: not found")
    return "; ".join(out)


def _tests_line(log: Path) -> str:
    """The GPU tests' outcome from the same device run, for the section."""
    lines = log.read_text(errors="replace").splitlines()
    done = [x.split("::")[-1].replace(" ", ": ", 1) for x in lines if "::" in x and x.rstrip().endswith("]")]
    final = next((x.strip("= ") for x in reversed(lines) if x.startswith("=") and " in " in x), "no summary")
    body = "\n".join(f"- `{x.split(' [')[0]}`" for x in done)
    return f"`tests/gpu` in the same device call ({final}):\n\n{body}"


def _attach_from_bundles(results: dict[str, Any], tar_path: Path) -> None:
    """Fill `attach` of the daemon runs from the saved bundles (for result files written before it existed)."""
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
        for key in ("idle", "busy"):
            run = results.get(key, {})
            if "status" not in run or run.get("attach"):
                continue
            want = f"gdb-{run['status']['scheduler_pid']}.txt"
            name = next((n for n in names if n.startswith(f"{key}/state/diagnostics/") and n.endswith(want)), None)
            member = tar.extractfile(name) if name else None
            if member is not None:
                run["attach"] = gdb_facts(member.read().decode(errors="replace"))


async def _step(results: dict[str, Any], name: str, coro: Any, save: Callable[[], None]) -> None:
    print(f"== {name}", flush=True)
    started = time.monotonic()
    try:
        results[name] = _jsonable(await coro)
    except Exception as err:
        results[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        print(results[name]["traceback"], flush=True)
    print(f"== {name} done in {time.monotonic() - started:.1f} s", flush=True)
    save()  # after every step: a run cut short by its time limit still leaves what it measured


async def run_all(rc: RunConfig, work: Path, out: Path | None) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": stamp(),
        "machine": machine(),
        **_gpu_facts(),
        "tools": _versions(find_py_spy() or "py-spy", find_gdb() or "gdb"),
        "config": asdict(rc),
    }

    def save() -> None:
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "gpu_bench.json").write_text(json.dumps(results, indent=1, default=str))
            save_bundles(work, out)

    await _step(results, "serve", run_serve(work / "serve", rc), save)
    await _step(results, "idle", run_hang(work / "idle", "deadlock", rc), save)
    await _step(results, "busy", run_hang(work / "busy", "spin", rc), save)
    await _step(results, "direct_idle", run_direct(work / "direct-idle", "deadlock", rc), save)
    await _step(results, "direct_busy", run_direct(work / "direct-busy", "spin", rc), save)
    return results


def _s(v: object) -> str:
    return "-" if v is None else f"{float(str(v)):.2f} s"


def _gb(v: object) -> str:
    return "-" if v is None else f"{int(str(v)) / GB:.1f} GB"


def _tool(run: dict[str, Any], pid: int, name: str) -> str:
    for t in run.get("tools", []):
        if t["pid"] == pid and t["tool"] == name:
            return f"{t['outcome']} in {t['duration_s']:.2f} s"
    return "not run"


def _attach(facts: dict[str, Any]) -> str:
    if not facts:
        return "-"
    what = [f"{facts['threads_exited']} threads of the target exited"]
    if facts.get("forked_helper"):
        what.append("the target forked a helper")
    if facts.get("kernel_focus"):
        what.append(f"focus on `{facts['kernel_focus']}`")
    return "; ".join(what)


def _stop(stopped: dict[str, Any]) -> str:
    wait = _s(stopped.get("release_wait_s"))
    return f"{_s(stopped.get('stop_s'))}, gpu_released={stopped.get('gpu_released')} after {wait}"


def _hang_column(run: dict[str, Any], direct: dict[str, Any]) -> list[str]:
    if "status" not in run:
        return [f"failed: {run.get('error', 'not run')[:80]}"] + ["-"] * (len(HANG_ROWS) - 1)
    st = run["status"]
    sched = int(st["scheduler_pid"])
    summary = run.get("summary", {})
    fig = summary.get("figures", {})
    stopped = run.get("stopped", {})
    gdb_kind = next((t["tool"] for t in run.get("tools", []) if t["tool"] in ("gdb", "cuda-gdb")), "cuda-gdb")
    d_ok = "mode" in direct
    return [
        f"{st['allocated_bytes'] / GB:.1f} GB ({st.get('spinner') if st['mode'] == 'spin' else 'lock-order deadlock'})",
        _s(run.get("detect_s")),
        f"{run.get('cause')} / {run.get('hang_class')}",
        f"{fig.get('gpu_util_percent') or 0:.0f} % / {fig.get('tree_cpu_cores') or 0:.2f} cores",
        _s(run.get("bundle_s")),
        _tool(run, sched, "py-spy-native"),
        _tool(run, sched, gdb_kind),
        ", ".join(run.get("kernels") or []) or "none named",
        _attach(run.get("attach") or {}),
        _gb(run.get("nvml_pids", {}).get(str(sched), run.get("nvml_pids", {}).get(sched))),
        _stop(stopped),
        f"{len(stopped.get('pids_found', []))} ({', '.join(map(str, stopped.get('pids_found', [])))})",
        _s(run.get("release", {}).get("after_death_s")),
        _s(direct.get("bundle_s_without_gdb")) if d_ok else f"failed: {direct.get('error', 'not run')[:60]}",
        _s(direct.get("bundle_s_with_gdb")) if d_ok else "-",
        _s(direct.get("kill_to_release_s")) if d_ok else "-",
    ]


HANG_ROWS = [
    "GPU memory held by the scheduler (what it did)",
    "detection: onset -> `hung` (journal)",
    "cause / class",
    "at the verdict: GPU util / tree CPU",
    "daemon's bundle (py-spy, --native, cuda-gdb; both processes)",
    "py-spy --native on the scheduler",
    "cuda-gdb on the scheduler",
    "kernels named by cuda-gdb",
    "cuda-gdb's attach, as its dump shows",
    "scheduler's memory in the bundle's nvml.json",
    "daemon's stop: SIGTERM -> tree gone; NVML verify",
    "processes the stop found (main, scheduler, any helper)",
    "scheduler gone -> NVML shows its memory free",
    "capture without cuda-gdb (same hang, no daemon)",
    "capture with cuda-gdb (same hang, no daemon)",
    "SIGKILL -> NVML shows the memory free",
]


def _cost(c: dict[str, Any]) -> str:
    spread = f"p50 {c['p50_ms']:.2f}, p95 {c['p95_ms']:.2f}, max {c['max_ms']:.2f}"
    return f"mean {c['mean_ms']:.2f} ms ({spread}; {c['calls']} calls)"


def render(results: dict[str, Any]) -> tuple[str, str]:
    """(hang table, serve table) as Markdown."""
    idle, busy = results.get("idle", {}), results.get("busy", {})
    cols = [_hang_column(idle, results.get("direct_idle", {})), _hang_column(busy, results.get("direct_busy", {}))]
    hang = table(["", "idle deadlock", "busy GPU spin"], [[r, a, b] for r, a, b in zip(HANG_ROWS, *cols, strict=True)])
    srv = results.get("serve", {})
    if "status" not in srv:
        serve_rows = [["serve", f"failed: {srv.get('error', 'not run')[:100]}"]]
    else:
        st = srv["status"]
        gpu = srv["api_status"].get("gpu", {})
        sched = str(st["scheduler_pid"])
        cost = srv["cost"]
        nvml = {str(k): v for k, v in srv["nvml_pids"].items()}
        stopped = srv["stopped"]
        serve_rows = [
            ["launch -> ready (daemon)", _s(srv["ready_s"])],
            ["allocated by the scheduler (torch)", _gb(st["allocated_bytes"])],
            [
                "NVML: scheduler pid holds",
                f"{_gb(nvml.get(sched))} (pid {sched}; {len(nvml)} pid(s) of the tree listed)",
            ],
            ["`/status` gpu.tree_mem_bytes", f"{_gb(gpu.get('tree_mem_bytes'))} ({gpu.get('status')})"],
            ["device used at ready / before", f"{_gb(srv['device_ready_bytes'])} / {_gb(srv['baseline_bytes'])}"],
            ["GpuProbe.observe per poll", _cost(cost)],
            ["daemon shutdown: stop, NVML verify", _stop(stopped)],
            ["device back at baseline after the stop", _s(srv["release_s"])],
        ]
    return hang, table(["serve mode", "value"], serve_rows)


def _reading(results: dict[str, Any]) -> str:
    """The few sentences a reader needs, with the run's own numbers."""
    idle, busy = results.get("idle", {}), results.get("busy", {})
    if "status" not in idle or "status" not in busy:
        return ""
    di, db = results.get("direct_idle", {}), results.get("direct_busy", {})
    helpers = []
    for run in (idle, busy):
        found = set(run.get("stopped", {}).get("pids_found", []))
        found -= {run["status"]["main_pid"], run["status"]["scheduler_pid"]}
        helpers += sorted(found)
    gdb_s = next(
        (
            t["duration_s"]
            for t in idle.get("tools", [])
            if t["pid"] == idle["status"]["scheduler_pid"] and "gdb" in t["tool"]
        ),
        None,
    )
    releases = [r.get("release", {}).get("after_death_s") for r in (idle, busy)]
    releases += [d.get("kill_to_release_s") for d in (di, db)]
    slowest = max((float(x) for x in releases if x is not None), default=None)
    text = (
        f"Reading it: the idle hang is judged one stall window after the onset ({_s(idle.get('detect_s'))}),"
        f" the busy one after `cpu_only_stall_s` ({_s(busy.get('detect_s'))}), as the design says. cuda-gdb's"
        f" attach is nearly all of a capture: {_s(gdb_s)} of the {_s(idle.get('bundle_s'))} idle bundle; without it"
        f" the same capture takes {_s(di.get('bundle_s_without_gdb'))} (idle) and"
        f" {_s(db.get('bundle_s_without_gdb'))} (busy)."
    )
    if busy.get("kernels"):
        text += f" cuda-gdb names the spinning kernel ({', '.join(busy['kernels'])})."
    attach = idle.get("attach") or {}
    if attach.get("threads_exited") or attach.get("forked_helper"):
        text += " Its attach changes the target: threads exit and the target forks a helper"
        if helpers:
            text += f" (pids {', '.join(map(str, helpers))}, found by the daemon's stop through its marker and stopped)"
        text += "."
    return text + f" NVML shows the GPU memory free within {_s(slowest)} of the processes' end, SIGKILL included.\n"


def section(results: dict[str, Any]) -> str:
    hang, serve = render(results)
    cfg = results["config"]
    tests = f"\n{results['tests']}\n" if results.get("tests") else ""
    return f"""## GPU: real NVML, a real idle and busy hang on one GPU

`python -m bench.gpu_bench --out DIR --write-docs` (or `--render DIR` afterwards) on the
`nvidia-h200` device: {results["gpu"]}, driver {results["driver"]}, {results["date"]}.
Machine: {results["machine"]}. Tools: {results["tools"]}.

The supervised program is `bench/gpuserver` (SGLang's log lines and process titles; one scheduler
holding up to {cfg["weights_gb"]:g} GB, at most half of the free GPU memory, plain `cudaMalloc` through
torch). Daemon in-process, poll {cfg["poll_s"]} s, `startup_stall_s` {cfg["stall_s"]} s,
`cpu_only_stall_s` {cfg["cpu_only_stall_s"]} s (the busy spin keeps a host core busy in `cudaDeviceSynchronize`,
so only CPU moves and the longer window applies), `gdb = "on_hang"`, py-spy with native frames,
`stop_grace_s` {cfg["stop_grace_s"]} s. The onset is the time the server wrote just after its last log line;
detection is the journal's `hung` transition minus the onset. The "no daemon" rows hang the same server
alone and time the daemon's capture function on it, then SIGKILL it.

{hang}

{serve}

{_reading(results)}{tests}"""


def save_bundles(work: Path, out: Path) -> None:
    with tarfile.open(out / "bundles.tar.gz", "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            in_bundle = path.parent.parent.name == "diagnostics"
            if path.is_file() and (in_bundle or path.name in ("events.jsonl", "server.log", "status.json")):
                tar.add(path, arcname=str(path.relative_to(work)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--weights-gb", type=float, default=40.0)
    parser.add_argument("--simulated-gpu", default=None, help="read the simulator's GPU file instead of NVML")
    parser.add_argument("--out", type=Path, default=None, help="where the result JSON and the bundles go")
    parser.add_argument("--write-docs", action="store_true", help="write the `gpu` section of docs/BENCHMARKS.md")
    parser.add_argument(
        "--render", type=Path, default=None, help="write the section from a saved --out folder (gpu_bench.json)"
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        results = json.loads((args.render / "gpu_bench.json").read_text())
        if (args.render / "bundles.tar.gz").exists():
            _attach_from_bundles(results, args.render / "bundles.tar.gz")
        if (args.render / "pytest.log").exists():
            results["tests"] = _tests_line(args.render / "pytest.log")
        print("\n".join(render(results)))
        write_section("gpu", section(results))
        return 0
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    gpu = GpuSettings(source="simulator", file=args.simulated_gpu) if args.simulated_gpu else GpuSettings()
    rc = RunConfig(device=args.device, weights_gb=args.weights_gb, gpu=gpu)
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    results = asyncio.run(run_all(rc, work, args.out))
    hang, serve = render(results)
    print(hang)
    print()
    print(serve)
    if args.write_docs and args.device == "cuda":
        write_section("gpu", section(results))
    failed = [k for k in ("serve", "idle", "busy", "direct_idle", "direct_busy") if "error" in results.get(k, {})]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
