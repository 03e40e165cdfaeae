"""Turn the recipe's results into docs/BENCHMARKS.md's "Real SGLang" and "Multi-GPU" sections.

    python3 -m bench.real.report --raw OUT/results-work.json OUT2/results-work4.json=after_ ... \
        [--gpu-tp gpu_tp.json] [--nvml nvml.json] [--cudagdb cudagdb.json]
    python3 -m bench.real.report          # re-render from the slim copy kept in bench/real/results/

`--raw` takes what `run.py pack` brought back from the device, keeps a slim copy (no timelines or
full bundles) under bench/real/results/, and writes the sections. A later file's lane replaces an
earlier one of the same name; `FILE=PREFIX` keeps a re-run's lanes apart (`after_deadlock`: lane
`deadlock` of a run made after a fix). Runs on any machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.gpu_tp_render import ran_section
from bench.real import busy_report
from bench.report import table, write_section

ROOT = Path(__file__).resolve().parents[2]

RESULTS = ROOT / "bench" / "real" / "results"
SLIM = RESULTS / "h200x2-2026-12-01.json"
INCIDENT_KEYS = ("onset", "verdict_at", "detect_s", "cause", "hang_class", "detail", "bundle_id", "bundle_s",
                 "stop_s", "gpu_released", "gpu_check", "release_wait_s", "survivors", "port_free", "decision",
                 "relaunch_rung", "ready_rung", "time_to_ready_s", "onset_to_ready_s", "error", "relaunch_error",
                 "frames_naming_alloc_memory_pool")


INCIDENTS = ("c_sigstop", "d_sigkill", "e_deadlock", "f_spec", "sigstop_rank1", "startup_deadlock_rank1")


def _slim_incident(x: dict[str, Any] | None) -> dict[str, Any] | None:
    if not x:
        return None
    out = {k: x.get(k) for k in INCIDENT_KEYS if k in x}
    bundle = x.get("bundle") or {}
    summary = bundle.get("summary") or {}
    out["bundle_reasons"] = summary.get("reasons")
    out["bundle_durations"] = summary.get("durations")
    out["bundle_summary_head"] = (bundle.get("summary_txt") or "").split("\nCommand:")[0]
    out["bundle_tools"] = [{k: t.get(k) for k in ("pid", "tool", "outcome", "duration_s")}
                           for t in summary.get("tools") or [] if t.get("outcome") != "skipped"]
    return out


def slim(raw: dict[str, Any]) -> dict[str, Any]:
    """What the docs need from one lane's result: figures, phases, decisions; no timelines."""
    out: dict[str, Any] = {}
    for key, val in raw.items():
        if key in ("timeline", "close", "launches") or key.endswith("_victim"):
            continue
        if (isinstance(val, dict) and "detect_s" in val) or key in INCIDENTS:
            out[key] = _slim_incident(val)
        elif isinstance(val, dict) and "phases" in val:
            out[key] = {k: v for k, v in val.items() if k not in ("titles", "processes", "gpu")}
            procs = val.get("processes") or []
            out[key]["roles"] = [(p.get("role"), p.get("rank"), p.get("title", "")[:40]) for p in procs]
        else:
            out[key] = val
    close = raw.get("close") or {}
    out["final_stop"] = next((e for e in reversed(close.get("events", [])) if e.get("event") == "server_stopped"), None)
    out["incidents"] = [{k: e.get(k) for k in ("ts", "cause", "hang_class", "rung")}
                        for e in close.get("events", []) if e.get("event") == "incident"]
    out["launches"] = [{"rung": e.get("rung"), "ts": e.get("ts"),
                        "flags": [a for a in str(e.get("argv", "")).split() if a.startswith("--")]}
                       for e in close.get("events", []) if e.get("event") == "server_launched"]
    if "timeline" in raw:
        out["roles_seen"] = sorted({str(r[1]) for row in raw["timeline"] for r in row.get("roles") or []})
    return out


def _raw_arg(arg: str) -> tuple[Path, str]:
    path, _, prefix = arg.partition("=")
    return Path(path), prefix


def build_slim(args: list[str]) -> dict[str, Any]:
    doc: dict[str, Any] = {"lanes": {}, "versions": {}}
    for arg in args:
        path, prefix = _raw_arg(arg)
        raw = json.loads(path.read_text())
        if not prefix:
            doc["versions"] = raw.get("versions") or doc["versions"]
        for name, lane in raw.items():
            if name in ("versions", "done"):
                continue
            if name.startswith("transcript"):
                doc["lanes"][prefix + name] = {"meta": {k: v for k, v in lane.get("meta", {}).items() if k != "argv"}}
            else:
                doc["lanes"][prefix + name] = slim(lane)
    return doc


def _s(v: Any, unit: str = " s") -> str:
    return "-" if v is None else (f"{v:.1f}{unit}" if isinstance(v, (int, float)) else str(v))


def _gb(v: Any) -> str:
    return "-" if v is None else f"{v / 1e9:.1f} GB"


def incident_row(label: str, fault: str, x: dict[str, Any] | None, window: str) -> list[str]:
    if not x or x.get("error"):
        return [label, fault, f"not measured: {(x or {}).get('error')}", "-", window, "-", "-", "-", "-"]
    nvml = x.get("gpu_released") and x.get("gpu_check") == "nvml"
    released = "verified (NVML)" if nvml else str(x.get("gpu_released"))
    ready = x.get("time_to_ready_s")
    after = (f"{x.get('relaunch_rung')}: ready {_s(ready)}" if ready is not None
             else f"{x.get('relaunch_rung')} (ready not waited for)")
    klass = f"`{x.get('hang_class')}`" if x.get("hang_class") else "no class (not a hang)"
    return [label, fault, f"`{x.get('cause')}` / {klass}", _s(x.get("detect_s")), window,
            _s(x.get("bundle_s")), _s(x.get("stop_s")), f"{released}, {_s(x.get('release_wait_s'))}", after]


def phase_table(phases: list[dict[str, Any]]) -> str:
    rows = [[p["phase"], _s(p["seconds"]), ", ".join(p["channels"]) or "-", _s(p["max_quiet_s"])]
            for p in phases if p["phase"] not in ("stopped",)]
    return table(["phase (from /status)", "lasted", "channels that moved", "longest quiet"], rows)


def _bundle_tools(x: dict[str, Any]) -> str:
    slow = [t for t in x.get("bundle_tools") or [] if (t.get("duration_s") or 0) >= 1.0]
    return ", ".join(f"{t['tool']} {t['duration_s']:.1f} s ({t['outcome']})" for t in slow) or "-"


def bundle_table(doc: dict[str, Any]) -> str:
    """The bundle of each real hang before and after cuda-gdb stopped reading the libraries' symbols."""
    lanes = doc["lanes"]
    pairs = [
        ("e. deadlock after weights load (1 GPU process)", (lanes.get("ladder") or {}).get("e_deadlock"),
         (lanes.get("after_deadlock") or {}).get("e_deadlock")),
        ("c. scheduler SIGSTOPped (py-spy cannot read it)", (lanes.get("serve") or {}).get("c_sigstop"),
         (lanes.get("after_stall") or {}).get("c_sigstop")),
        ("tp 2: start-up deadlock in rank 1 (2 GPU processes)",
         (lanes.get("tp2_deadlock") or {}).get("startup_deadlock_rank1"),
         (lanes.get("after_tp2_deadlock") or {}).get("startup_deadlock_rank1")),
    ]
    rows = []
    for label, before, after in pairs:
        b, a = before or {}, after or {}
        rows.append([label, _s(b.get("bundle_s")), _bundle_tools(b), _s(a.get("bundle_s")), _bundle_tools(a),
                     f"`{a.get('hang_class')}`" if a else "-"])
    head = ["hang", "bundle before", "tools over 1 s before", "bundle after", "tools over 1 s after", "class after"]
    return table(head, rows)


def probe_table(doc: dict[str, Any]) -> str:
    rows = doc.get("cudagdb") or []
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["variant"], []).append(r)
    what = {"daemon": "the daemon's batch before (symbols, `thread apply all bt`, `info cuda kernels`)",
            "no_solib": "the same with `-iex \"set auto-solib-add off\"` (the daemon's batch after py-spy --native)",
            "kernels_only": "`info cuda kernels` alone, symbols read",
            "kernels_only_no_solib": "`info cuda kernels` alone, no library symbols"}
    # "kernels listed": the spin kernel's row was there in every run (the parser of that day cut its
    # name at the first parenthesis; tests/diagnostics/test_diag_tools.py now holds the whole row).
    out = [[what.get(k, k), ", ".join(f"{r['seconds']:.2f} s" for r in v),
            "yes" if all(r["frame0"] for r in v) else "no",
            "yes" if all(r["kernels"] for r in v) else "no"] for k, v in by.items()]
    return table(["cuda-gdb batch", "attach to exit", "host frames", "kernels listed"], out)


def real_section(doc: dict[str, Any]) -> str:
    v = doc["versions"]
    lanes = doc["lanes"]
    serve, ladder, pw = lanes.get("serve", {}), lanes.get("ladder", {}), lanes.get("piecewise", {})
    a, b = serve.get("a_start", {}), pw.get("b_start", {})
    after_e = (lanes.get("after_deadlock") or {}).get("e_deadlock")
    after_c = (lanes.get("after_stall") or {}).get("c_sigstop")
    rows = [
        ["a. clean start (base rung)", "none", f"ready, {a.get('incidents')} incidents", "-", "-", "-", "-", "-",
         f"base: ready {_s(a.get('time_to_ready_s'))}"],
        ["b. default flags (piecewise prefill graphs)", "none, shipped default windows",
         f"ready, {b.get('incidents')} incidents", "-", f"longest quiet {_s(b.get('max_quiet_s'))} of 180 s "
         f"(margin {_s(b.get('margin_s'))})", "-", "-", "-", f"base: ready {_s(b.get('time_to_ready_s'))}"],
        incident_row("c. scheduler SIGSTOPped under load", "SIGSTOP `sglang::scheduler`, 4 clients",
                     serve.get("c_sigstop"), "10 s + 2 polls of 1 s"),
        incident_row("d. scheduler SIGKILLed under load", "SIGKILL `sglang::scheduler`", serve.get("d_sigkill"),
                     "next poll"),
        incident_row("e. deadlock after weights load", "lock in `ModelRunner.alloc_memory_pool` (sitecustomize)",
                     ladder.get("e_deadlock"), "30 s + 2 polls"),
        incident_row("f. random EAGLE-3 draft, `on_spec_regression = \"fallback\"`", "acceptance 1.0 under load",
                     ladder.get("f_spec"), "floor 1.5 over 20 s"),
    ]
    if after_c:
        rows.append(incident_row("c again, after the cuda-gdb change", "as c", after_c, "10 s + 2 polls of 1 s"))
    if after_e:
        rows.append(incident_row("e again, after the cuda-gdb change", "as e", after_e, "30 s + 2 polls"))
    head = ["scenario", "fault", "verdict (cause / class)", "onset -> verdict", "window", "bundle", "stop",
            "GPU release", "relaunch -> ready"]
    launches = ladder.get("launches", [])
    walk = " -> ".join(f"`{x['rung']}`" for x in launches)
    served = ladder.get("f_served_on_fallback") or {}
    e = ladder.get("e_deadlock") or {}
    c = serve.get("c_sigstop") or {}
    d = serve.get("d_sigkill") or {}
    f = ladder.get("f_spec") or {}
    stops = [x for x in (c, d, e, f, after_c or {}, after_e or {}) if x]
    nvml_all = all(x.get("gpu_released") is True and x.get("gpu_check") == "nvml" for x in stops)
    c_reasons = "\n".join(f"  - {r}" for r in (c.get("bundle_reasons") or []))
    stopped_gdb = " and ".join(_s(t.get("duration_s")) for x in (c, after_c or {})
                               for t in x.get("bundle_tools") or [] if t.get("tool") == "cuda-gdb") or "-"
    return f"""## Real SGLang: the fault matrix on an H200 (issue 14)

Real `sglang.launch_server` {v.get('sglang')} under the daemon (a real `sglang-supervisor run` process,
driven over its API), torch {v.get('torch')}, transformers {v.get('transformers')}, Python
{v.get('python')}, {v.get('gpu')} x{v.get('gpus')} (`nvidia-h200-x2`), driver {v.get('driver')},
{v.get('date')}. Model: the recipe's tiny random Llama (8 layers, hidden 512) with a random EAGLE-3
draft, `--tp-size 1`, base rung `--speculative-algorithm EAGLE3 ... --cuda-graph-max-bs 8
--disable-piecewise-cuda-graph --mem-fraction-static 0.25` (b: the same without
`--disable-piecewise-cuda-graph`); rungs `no-cuda-graph` and `no-speculation`; `retries_per_rung = 1`,
`stable_s` at its default 600 s. Windows: poll 1 s, `startup_stall_s` 60 (30 in e),
`serving_stall_s` 10, health every 2 s with SGLang's 20 s timeout behind it; b keeps every shipped
default (poll 2 s, `startup_stall_s` 180). gdb is NVIDIA's cuda-gdb (the only gdb there). The
matrix ran its four lanes at once, two servers per GPU (start-ups 45 s apart), so start-up times
include that contention; a, c and d are from a re-run of lane `serve` (beside the cuda-gdb probe on
the other GPU; the matrix's own run of it picked a zombie fork as d's victim: fixed in the recipe),
and the two "again" rows are
single-lane runs made after the cuda-gdb change below. Reproduce: `python3 -m
bench.real.build_bundle` here, then on the GPU machine `sh bench/real/device.sh` (or `python3 -m
bench.real.run` `setup`, `matrix`, `tp2`, `pack`), and `python3 -m bench.real.report --raw ...`
(bench/real/README.md).

{table(head, rows)}

a's start-up, phase by phase (the daemon's `/status` every 0.5 s):

{phase_table(a.get('phases', []))}

b's start-up with the piecewise prefill graph capture on (its first compilation is silent in the
log; other channels moved throughout):

{phase_table(b.get('phases', []))}

What the runs showed:
- **Detection** was within the window plus two polls in every scenario: c
  {_s(c.get('detect_s'))} (10 s window), e {_s(e.get('detect_s'))} (30 s window), d at the next
  poll ({_s(d.get('detect_s'))}), f's regression {_s(f.get('detect_s'))} after load began. e's bundle
  names the SGLang function in the stacks
  ({', '.join(sorted((e.get('frames_naming_alloc_memory_pool') or {}).keys())) or 'no file'}).
- **A stopped scheduler is named and the class judged from the schedulers**: c is `{c.get('hang_class')}`
  (it was `busy_spin` from the front end's core before issue 14's fix), and the bundle says so first:
{c_reasons}
- **False incidents**: none in a or b, and none before any fault. Under the load of c, the server went
  `degraded` with a `spec_regression` alert (`on_spec_regression = "alert"` in that lane): a true
  reading, the random draft's acceptance is 1.0. b's longest quiet spell was {_s(b.get('max_quiet_s'))}
  against the shipped 180 s window.
- **GPU memory** was {'verified free through NVML after every stop' if nvml_all else 'NOT verified after every stop'},
  within {_s(max((x.get('release_wait_s') or 0) for x in stops) if stops else None)} of the tree being gone.
- **Retries, then the ladder, walked for real**: launches {walk or 'not recorded'}. e's deadlock was
  retried on `base` ({(e.get('decision') or {}).get('reason')}) and, the fault being one-shot, `base`
  was ready again {_s(e.get('onset_to_ready_s'))} after the onset; `/restart {{"rung": "no-cuda-graph"}}`
  then took it to `no-cuda-graph`, ready in {_s(ladder.get('g_no_cuda_graph_ready_s'))}; f's regression
  jumped to `no-speculation` ({(f.get('decision') or {}).get('reason')}), which served
  {served.get('requests_ok')} requests in 10 s. Every rung was launched with its own flags and reached
  ready, so SGLang accepted them. In lane `serve`, d came after c's retry of `base` and inside
  `stable_s`, so d stepped down to `{d.get('relaunch_rung')}` ({(d.get('decision') or {}).get('reason')}):
  the retry budget of a rung is refilled only after `stable_s` of service, by design.
- **d's class** was `{d.get('hang_class')}` in this run: with the only scheduler gone, the front end's
  core was the only figure left. Fixed after the run: a tree with no scheduler left is `unknown`, with
  the reason "no scheduler is left (every rank exited)" (`tests/integration/test_serving_watchdog.py::
  test_the_only_rank_dying_is_no_hang_class`); not re-measured on the GPU.
- **SGLang's own crash path** after d's SIGKILL: `Subprocess scheduler_0 (pid=...) crashed with exit
  code -9. Triggering SIGQUIT for cleanup...`, `Sleeping 5 seconds before crash diagnostics`, `No live
  scheduler processes found; skipping py-spy and CUDA coredump.`, then `kill_process_tree` about 12 s
  after the kill, long after the daemon's verdict
  (tests/fixtures/real_sglang/0.5.16-eagle3-tp1/crash_path.log). A SIGTERM stop always waits out
  the grace: SGLang's watchdog sees the scheduler's -15 and takes the same 5 s crash path.

### Bundle time with cuda-gdb (target: under 10 s)

cuda-gdb's attach to a torch process is mostly reading the symbols of every shared library:

{probe_table(doc)}

(`bench/real/cudagdb_probe.py`: a torch process with 4 GB, 100 idle threads and torch's spin kernel
resident.) So where py-spy `--native` has named a process's host frames, the daemon now runs cuda-gdb
with `-iex "set auto-solib-add off"`, for the kernels; a process py-spy cannot read still gets the
full cuda-gdb, its only native view.

{bundle_table(doc)}

The target is met where py-spy can read the GPU processes (e and the two-rank collective). A
SIGSTOPped rank is at its edge: py-spy fails on a process in state T, so that rank gets the full
cuda-gdb attach ({stopped_gdb} in the two runs, with no change in what it did); the verdict
is already in by then, and the bundle says the rank is stopped whatever cuda-gdb prints. Left so:
the stopped rank's native stack is the one stack that shows where it stopped.
"""


def tp2_rows(doc: dict[str, Any]) -> str:
    lanes = doc["lanes"]
    tp2, dl = lanes.get("tp2", {}), lanes.get("tp2_deadlock", {})
    after = (lanes.get("after_tp2_deadlock") or {}).get("startup_deadlock_rank1")
    s = tp2.get("sigstop_rank1") or {}
    e = dl.get("startup_deadlock_rank1") or {}
    rows = [
        incident_row("start-up deadlock in rank 1 only", "lock in rank 1's `alloc_memory_pool`", e, "30 s + 2 polls"),
        incident_row("rank 1 SIGSTOPped under load", "SIGSTOP `sglang::scheduler_TP1`, 4 clients", s,
                     "10 s + 2 polls of 1 s"),
    ]
    if after:
        rows.append(incident_row("start-up deadlock in rank 1, after the cuda-gdb change", "as above", after,
                                 "30 s + 2 polls"))
    head = ["scenario", "fault", "verdict (cause / class)", "onset -> verdict", "window", "bundle", "stop",
            "GPU release", "relaunch -> ready"]
    reasons = "\n".join(f"  - {r}" for r in (e.get("bundle_reasons") or []))
    reasons_s = "\n".join(f"  - {r}" for r in (s.get("bundle_reasons") or []))
    ready = tp2.get("ready") or {}
    start = tp2.get("start") or {}
    roles = ", ".join(f"`{r[2].strip()}` ({r[0]}{'' if r[1] is None else ' ' + str(r[1])})"
                      for r in ready.get("roles", []) if r[0] in ("scheduler", "detokenizer"))
    return f"""### Real SGLang with `--tp-size 2` under the daemon

Same recipe, versions and windows as the "Real SGLang" section, over both GPUs
(`NCCL_NVLS_ENABLE=0`, `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`, `NVSHMEM_DISABLE_NVLS=1` in the server's
environment), two lanes at once, start-ups 45 s apart (`run.py tp2`). Ready on the base rung in
{_s(start.get('time_to_ready_s'))}, 0 incidents, with {roles or '-'}, the main process (`main`) and
multiprocessing's resource tracker (`other`); NVML attributed {_gb(ready.get('tp0_bytes'))} to TP0 on
GPU {ready.get('tp0_gpu')} and {_gb(ready.get('tp1_bytes'))} to TP1 on GPU {ready.get('tp1_gpu')} (each
scheduler's pid on its own GPU; NVML listed no other process of the tree).

{table(head, rows)}

The start-up deadlock's bundle:
{reasons}

The SIGSTOP's bundle:
{reasons_s}

The SIGSTOP under load is now `serving_stall` within its window (it was `unhealthy` after 64 s in
the first two-GPU run): the stall followed a prefill, and SGLang refreshes its scheduler gauges only
per logged batch, so they froze at 0 running, 0 queued; the requests in flight now also come from
`sglang:http_requests_active` on generation routes, which the HTTP process keeps live (the detail
reads "4 running and 0 queued requests (4 open at the HTTP front)").

Also seen: the "after" run of the rank-1 deadlock shared GPU 0 with lane `stall`'s server, and SGLang
refused the first two tp-2 launches: `RuntimeError: The memory capacity is unbalanced. Some GPUs may be
occupied by other processes` in TP1, then `kill_process_tree` of its own tree (the daemon saw
`exited`, killed by signal 9, retried, stepped down to `no-cuda-graph`, where the fault then fired).
An `exited` incident now carries that error in its detail (`tests/supervisor/test_watchdog.py::
test_exit_names_the_error_that_brought_the_tree_down`, on the real log).
"""


def harness_log(text: str) -> dict[str, str]:
    """The figure/value rows `bench/gpu_tp.py` printed (its JSON did not come back from that call)."""
    rows: dict[str, str] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("figure", "") and not set(cells[0]) <= {"-"}:
            rows[cells[0]] = cells[1]
    return rows


def harness_again(rows: dict[str, str], when: str) -> str:
    if not rows:
        return ""
    return f"""Run again on {when} with the code of the matrix (before the cuda-gdb change; printed table):

{table(["figure", "value"], [[k, v] for k, v in rows.items()])}
"""


def multi_section(doc: dict[str, Any], harness: list[dict[str, Any]]) -> str:
    runs = "\n".join(ran_section(r).replace("on one GPU", "on two GPUs" if r["tp_size"] > 1 else "on one GPU")
                     for r in harness)
    again = harness_again(doc.get("gpu_tp_again") or {}, str(doc.get("versions", {}).get("date", ""))[:10])
    return f"""## Multi-GPU: tensor-parallel collective hangs on two H200s (issues 11, 15)

Run on `nvidia-h200-x2` (two H200s of one host, NCCL, NVLink multicast off). First the project's
own TP harness (`bench/gpuserver/tp.py`: one process per rank titled `sglang::scheduler_TP{{n}}`,
all-reduces in a loop, the last rank dropping out after 10 steps), then real SGLang with tensor
parallelism 2. Earlier stand-ins (gloo on the CPU, NCCL with one rank on one GPU) are superseded by
these runs and were removed from this page; they are in the git history.

{runs}
{again}
{tp2_rows(doc)}"""


def add_ranks(doc: dict[str, Any], raw_args: list[str]) -> None:
    """Per-rank GPU memory of the TP2 server from its bundle's nvml.json (kept in the files archive)."""
    for arg in raw_args:
        path, prefix = _raw_arg(arg)
        lane = json.loads(path.read_text()).get("tp2")
        if not lane or prefix:
            continue
        bundle = (lane.get("sigstop_rank1") or {}).get("bundle") or {}
        pids = {q.get("pid"): q for q in (bundle.get("summary") or {}).get("pids", [])}
        ready = doc["lanes"]["tp2"].setdefault("ready", {})
        ready["roles"] = [(q.get("role"), q.get("rank"), str(q.get("title", ""))[:40]) for q in pids.values()]
        ready["rank_pids"] = {str(q.get("rank")): q.get("pid") for q in pids.values() if q.get("role") == "scheduler"}


def with_harness(results: list[dict[str, Any]]) -> None:
    """`bench/gpu_tp.py --write-docs`: the harness's run replaces the saved one, and both sections are
    written again (the multi-GPU section holds the harness and real SGLang together)."""
    doc = json.loads(SLIM.read_text())
    doc["gpu_tp"] = results
    SLIM.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    render()


def render() -> None:
    doc = json.loads(SLIM.read_text())
    write_section("real-sglang", real_section(doc))
    write_section("multi-gpu", multi_section(doc, doc.get("gpu_tp", [])))
    busy_report.render(write_section)  # issue 22's section, once its results are stored
    print(f"wrote the real-sglang and multi-gpu sections of docs/BENCHMARKS.md from {SLIM.relative_to(ROOT)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", nargs="*", default=None, help="results-*.json from run.py pack, each FILE or FILE=PREFIX")
    ap.add_argument("--gpu-tp", type=Path, default=None)
    ap.add_argument("--nvml", type=Path, default=None, help="nvml.json of the TP2 SIGSTOP bundle (files archive)")
    ap.add_argument("--cudagdb", type=Path, default=None, help="cudagdb.json from bench/real/cudagdb_probe.py")
    ap.add_argument("--keep-harness", type=Path, default=None, help="take gpu_tp from this earlier slim copy")
    ap.add_argument("--gpu-tp-log", type=Path, default=None, help="what bench/gpu_tp.py printed, for a re-run")
    ap.add_argument("--busy", type=Path, default=None, help="results-*.json with issue 22's busyhang/clean3 lanes")
    args = ap.parse_args()
    if args.busy:
        busy_report.store(args.busy)
    if args.raw:
        doc = build_slim(args.raw)
        add_ranks(doc, args.raw)
        if args.nvml:
            ready = doc["lanes"]["tp2"]["ready"]
            held = {q["pid"]: q for q in json.loads(args.nvml.read_text()).get("processes", [])}
            for rank in ("0", "1"):
                q = held.get(ready["rank_pids"].get(rank), {})
                ready[f"tp{rank}_bytes"] = q.get("used_bytes")
                ready[f"tp{rank}_gpu"] = q.get("gpu_index")
        if args.cudagdb:
            doc["cudagdb"] = json.loads(args.cudagdb.read_text())
        if args.gpu_tp:
            doc["gpu_tp"] = [json.loads(args.gpu_tp.read_text())]
        elif args.keep_harness:
            doc["gpu_tp"] = json.loads(args.keep_harness.read_text()).get("gpu_tp", [])
        if args.gpu_tp_log:
            doc["gpu_tp_again"] = harness_log(args.gpu_tp_log.read_text())
        RESULTS.mkdir(parents=True, exist_ok=True)
        SLIM.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    render()
    return 0


if __name__ == "__main__":
    sys.exit(main())
