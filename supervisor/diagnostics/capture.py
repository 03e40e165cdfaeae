"""One capture: every process of the tree in parallel, then classify, then one bundle on disk.

Nothing here sends a signal: a tool that leaves a process stopped is undone by the `resume`
callable the daemon passes (supervisor.process.resume_stopped), called after every tool run --
except for a process that was already stopped (state T) before the capture began: that stop is
the evidence (a SIGSTOPped rank), and the bundle leaves it as it found it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from probes.proctree import read_stat
from probes.types import ProcInfo, ThreadInfo
from supervisor.common.redact import Redactor, argv_secrets
from supervisor.diagnostics import tools
from supervisor.diagnostics.bundle import enforce_retention, safe_id, unique_id, write_bundle
from supervisor.diagnostics.capturerecords import (
    BundleResult,
    CaptureRequest,
    Evidence,
    ProcEvidence,
    ToolOutcome,
)
from supervisor.diagnostics.classify import classify
from supervisor.diagnostics.culprit import culprits, died_culprit, held_from, lost_pids, never_joined
from supervisor.diagnostics.flightrec import FrReport, bundle_files, flight_dumps, flight_read
from supervisor.diagnostics.frtrace import trace_job
from supervisor.diagnostics.grouptext import group_text
from supervisor.diagnostics.procinfo import ProcSnapshot, read_proc, render_proc, sample_threads
from supervisor.diagnostics.ras import RasReport, query_ras, ras_address
from supervisor.diagnostics.rasview import collective_doc, findings, ras_doc, ras_text, with_ras
from supervisor.diagnostics.sglangdump import sglang_files, with_sglang_dumps
from supervisor.diagnostics.spread import sample_spread, spread_text
from supervisor.diagnostics.summary import ProcRecord, build_summary, gpu_doc, render_text
from supervisor.diagnostics.toolrun import (
    ProcRun,
    Resume,
    gdb_adds_nothing,
    gil_look,
    host_frames_instead_of_cuda_gdb,
    idle_gpus,
    missing_tool,
    read_pystack,
    run_one,
    task_ids,
)

CPU_WINDOW_S = 0.1  # per-process CPU rates are measured over this window, before any tool runs
# torch's own FR analyzer runs after the bundle (frtrace.py: importing torch is 3-11 s, and bounded
# at 3 s beside the tools it was the longest part of a real GPU hang's 4.4 s bundle without ever
# finishing); the daemon's own reading of the dumps (frdump.py, standard library) is what the summary says.
FR_ANALYZER_AFTER_BUNDLE = 0.0
RAS_TIMEOUT_S = 8.0  # NCCL's own collective legs get 5 s; a dead peer costs one leg


async def _capture_one(
    info: ProcInfo,
    req: CaptureRequest,
    paths: tools.ToolPaths,
    env: dict[str, str],
    resume: Resume | None,
    deadline: float,
    stopped: bool = False,
    in_d: bool = False,
) -> ProcRun:
    """py-spy, then py-spy --native, then gdb: in turn, as two tracers cannot attach at once. A
    stopped process (state T) is read by pystack instead of py-spy, which cannot read it. A process
    whose main thread is in D state cannot be stopped by a tracer until the kernel wakes it (py-spy's
    pause and gdb's attach would wait out their timeouts and read nothing): py-spy reads it without
    pausing it, which is consistent for a thread that sits in the kernel, and the pausing tools are
    skipped, saying why."""
    run = ProcRun(info)
    pid = info.pid
    native_named = False  # py-spy --native (or pystack --native) gave host frames with their names
    spy_named = False  # py-spy --native itself did (a live process it reads)
    if req.py_spy and stopped and paths.pystack is not None:
        why = "the process is stopped (state T): py-spy cannot read it; pystack reads it instead"
        run.outcomes.append(ToolOutcome(pid, "py-spy", "skipped", 0.0, detail=why))
        native_named = await read_pystack(run, req, paths.pystack, env, resume, deadline)
    elif req.py_spy:
        if paths.py_spy is None:
            run.outcomes.append(missing_tool(pid, "py-spy", "py-spy"))
        else:
            argv = tools.py_spy_argv(paths.py_spy, pid, native=False, nonblocking=req.nonblocking or in_d)
            res = await run_one(run, "py-spy", argv, req.py_spy_timeout_s, env, resume, deadline)
            run.python = tools.parse_py_spy(res.stdout)
            if req.native and in_d:
                run.outcomes.append(ToolOutcome(pid, "py-spy-native", "skipped", 0.0, detail=_IN_D))
            elif req.native and req.nonblocking:
                why = (
                    "py-spy cannot read native frames without pausing the process, and a server that is "
                    "not hung is not paused unasked (diagnose --native pauses each process briefly)"
                )
                run.outcomes.append(ToolOutcome(pid, "py-spy-native", "skipped", 0.0, detail=why))
            elif req.native:
                argv = tools.py_spy_argv(paths.py_spy, pid, native=True, nonblocking=False)
                res = await run_one(run, "py-spy-native", argv, req.py_spy_timeout_s, env, resume, deadline)
                native_threads = tools.parse_py_spy(res.stdout)
                if native_threads:
                    run.python = native_threads
                    native_named = spy_named = True
        if not run.python and paths.pystack is not None and os.path.exists(f"/proc/{pid}"):
            native_named = await read_pystack(run, req, paths.pystack, env, resume, deadline)
        if req.trigger == "hung" and info.role in ("scheduler", "pending") and paths.pystack is not None:
            await gil_look(run, req, paths.pystack, env, deadline)  # the culprit may hold the GIL asleep
    if req.gdb and in_d:
        run.outcomes.append(ToolOutcome(pid, "gdb", "skipped", 0.0, detail=_IN_D))
    elif req.gdb:
        exe, kind = paths.debugger(_holds_gpu(info, req))
        if exe is None and kind == "cuda-gdb":
            why = "only cuda-gdb is installed, and this process holds no GPU memory: py-spy covers it"
            run.outcomes.append(ToolOutcome(pid, "cuda-gdb", "skipped", 0.0, detail=why))
        elif exe is None:
            run.outcomes.append(missing_tool(pid, "gdb", "gdb (or cuda-gdb)"))
        elif (redundant := gdb_adds_nothing(run, kind, spy_named, task_ids(pid))) is not None:
            run.outcomes.append(ToolOutcome(pid, kind, "skipped", 0.0, detail=redundant))
        elif (
            kind == "cuda-gdb"
            and req.native
            and not req.nonblocking
            and paths.pystack is not None
            and (idle := idle_gpus(pid, req.gpu))
            and (covered := await host_frames_instead_of_cuda_gdb(run, req, paths.pystack, env, resume, deadline, idle))
        ):
            run.outcomes.append(ToolOutcome(pid, kind, "skipped", 0.0, detail=covered))
        else:
            # cuda-gdb is there for the GPU kernels; the host frames py-spy --native already named.
            argv = tools.gdb_argv(exe, pid, kind, shared_symbols=not (kind == "cuda-gdb" and native_named))
            res = await run_one(run, kind, argv, req.gdb_timeout_s, env, resume, deadline)
            run.native = await asyncio.to_thread(tools.parse_gdb, res.stdout)
            run.kernels = tools.parse_cuda_kernels(res.stdout) if kind == "cuda-gdb" else ()
    return run


def _fr_lost(fr: FrReport) -> set[int]:
    """The ranks the Flight Recorder says the others wait for (lagging, or no dump while others have one)."""
    v = fr.verdict
    if v is None or v.mismatch == "none_in_flight":
        return set()
    return set(v.lagging_ranks) | (set(v.missing_ranks) if fr.dumps else set())


def _holds_gpu(info: ProcInfo, req: CaptureRequest) -> bool:
    """NVML's word where there is one; else the processes where the model runs."""
    if req.gpu is not None and req.gpu.status == "ok":
        return any(p.pid == info.pid for p in req.gpu.processes)
    return info.role in ("scheduler", "pending")


def _evidence(
    req: CaptureRequest,
    runs: Sequence[ProcRun],
    got: _Collected,
) -> Evidence:
    procs = []
    for run, snap, late in zip(runs, got.before, got.after, strict=True):
        samples = tuple(s for s in (run.info.threads, snap.threads, late) if s)
        procs.append(
            ProcEvidence(
                run.info.pid,
                run.info.role,
                run.info.rank,
                run.info.title,
                samples,
                run.python,
                run.native,
                run.kernels,
                stopped=run.info.pid in got.stopped,
                cpu_cores=got.cpu_cores.get(run.info.pid),
            )
        )
    procs = with_sglang_dumps(procs, req.sglang_dumps)
    gpu_util = req.gpu_util_percent
    if gpu_util is None and req.gpu is not None and req.gpu.status == "ok" and req.gpu.devices:
        gpu_util = req.gpu.max_util_percent
    return Evidence(tuple(procs), req.phase, req.tree_cpu_cores, gpu_util, req.busy_cpu_cores, req.busy_gpu_percent)


def _json(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode()


@dataclass(frozen=True)
class _Collected:
    before: list[ProcSnapshot]  # /proc before any tool ran
    runs: list[ProcRun]
    after: list[tuple[ThreadInfo, ...]]  # thread states once every tool is done
    durations: dict[str, float]
    stopped: frozenset[int] = frozenset()  # in state T before any tool attached
    cpu_cores: dict[int, float] = field(default_factory=dict)  # pid -> CPU rate before the tools
    ras: RasReport | None = None  # NCCL's RAS report, asked while the tools ran
    fr: FrReport | None = None  # NCCL Flight Recorder dumps, asked before any tool attached


def _cpu_times(pids: Sequence[int]) -> dict[int, float]:
    return {pid: st.cpu_time_s for pid in pids if (st := read_stat(pid)) is not None}


_IN_D = "the main thread is in D state: a tracer's stop waits until the kernel wakes it, so nothing pauses it"


def _in_d_before(info: ProcInfo, snap: ProcSnapshot) -> bool:
    """The main thread in D state (uninterruptible: a hung mount, a driver call) before we came."""
    return any(t.tid == info.pid and t.state == "D" for t in snap.threads)


def _stopped_before(info: ProcInfo, snap: ProcSnapshot) -> bool:
    """Stopped by a signal before we came: every thread in T (a tracer's stop reads `t`)."""
    if snap.threads:
        return all(t.state == "T" for t in snap.threads)
    return snap.alive and info.status == "stopped"


def _stopped_now(pid: int) -> bool:
    """Every thread of `pid` in T (stopped by a signal), read from /proc now; False when unreadable."""
    snap = read_proc(pid, kernel_stacks=False)
    return snap.alive and bool(snap.threads) and all(t.state == "T" for t in snap.threads)


async def _rates(pids: Sequence[int]) -> tuple[list[ProcSnapshot], dict[int, float]]:
    """/proc of every process, and each one's CPU rate over CPU_WINDOW_S, before any tool runs."""
    tic = time.monotonic()
    first = await asyncio.to_thread(_cpu_times, pids)
    before = await asyncio.to_thread(lambda: [read_proc(pid) for pid in pids])
    await asyncio.sleep(max(0.0, CPU_WINDOW_S - (time.monotonic() - tic)))
    second = await asyncio.to_thread(_cpu_times, pids)
    span = time.monotonic() - tic
    rates = {pid: round(max(0.0, second[pid] - first[pid]) / span, 3) for pid in second if pid in first}
    return before, rates


async def _collect(req: CaptureRequest, paths: tools.ToolPaths, resume: Resume | None) -> _Collected:
    start = time.monotonic()
    pids = [p.pid for p in req.processes]
    env = tools.tool_env(dict(os.environ))
    ras_task = asyncio.create_task(_ask_ras(req))  # before any tool pauses a rank's RAS thread
    # Every rank's pipe written and the dumps waited for before any debugger; the CPU rates, which
    # only read /proc, are sampled meanwhile.
    fr, (before, rates) = await asyncio.gather(_ask_fr(req), _rates(pids))
    fr_read = asyncio.create_task(_read_fr(fr, req))  # read and judged while the tools run
    stopped = frozenset(p.pid for p, s in zip(req.processes, before, strict=True) if _stopped_before(p, s))
    in_d = frozenset(p.pid for p, s in zip(req.processes, before, strict=True) if _in_d_before(p, s))
    proc_s = time.monotonic() - start
    deadline = time.monotonic() + req.budget_s
    runs = await asyncio.gather(
        *(
            _capture_one(
                p, req, paths, env, None if p.pid in stopped else resume, deadline, p.pid in stopped, p.pid in in_d
            )
            for p in req.processes
        )
    )
    tools_s = time.monotonic() - start - proc_s
    after = await asyncio.to_thread(lambda: [sample_threads(pid) for pid in pids])
    ras = await ras_task
    fr = await fr_read
    durations = {"proc_s": round(proc_s, 4), "tools_s": round(tools_s, 4), "ras_s": ras.duration_s, "fr_s": fr.wait_s}
    return _Collected(before, list(runs), after, durations, stopped, rates, ras, fr)


async def _ask_fr(req: CaptureRequest) -> FrReport:
    if req.trigger != "hung" or not req.flight_recorder:
        return FrReport("off", "only a hang's capture asks the Flight Recorder" if req.flight_recorder else "off")
    wait = min(req.flight_recorder_wait_s, max(0.5, req.budget_s / 2))
    ranks = [p.pid for p in req.processes if p.role in ("scheduler", "pending")]
    if ranks and all(await asyncio.to_thread(lambda: [_stopped_now(pid) for pid in ranks])):
        why = f"every rank ({len(ranks)}) is stopped (state T): none can read its pipe, so none was written"
        return FrReport("stopped", why)
    try:
        return await flight_dumps(req.env, wait)
    except Exception as err:  # the Flight Recorder must never cost the rest of the evidence
        return FrReport("error", f"{type(err).__name__}: {err}"[:300])


async def _read_fr(fr: FrReport, req: CaptureRequest) -> FrReport:
    ranks = [p.pid for p in req.processes if p.role in ("scheduler", "pending")]
    try:
        return await flight_read(fr, req.env, ranks, req.argv, FR_ANALYZER_AFTER_BUNDLE)
    except Exception as err:
        return replace(fr, status="error", reason=f"{type(err).__name__}: {err}"[:300])


async def _ask_ras(req: CaptureRequest) -> RasReport:
    """NCCL's RAS service, at the address the server's environment gives it (bounded, off the loop)."""
    env = {**os.environ, **req.env}
    address = ras_address(env)
    if env.get("NCCL_RAS_ENABLE") == "0":
        return RasReport("disabled", address, "NCCL_RAS_ENABLE=0 in the server's environment: not asked")
    return await asyncio.to_thread(query_ras, address, min(RAS_TIMEOUT_S, max(1.0, req.budget_s)))


def _redactor(req: CaptureRequest, before: Sequence[ProcSnapshot]) -> Redactor:
    """Secrets as the daemon gave them and as every process of the tree really has them."""
    argvs = [req.argv, *(s.cmdline for s in before)]
    envs = [req.env, *(dict(s.environ) for s in before)]
    return Redactor.from_envs(envs, extra=[v for a in argvs for v in argv_secrets(a)])


def _files(req: CaptureRequest, got: _Collected, redactor: Redactor) -> dict[str, bytes]:
    texts: dict[str, str] = {}
    for run, snap in zip(got.runs, got.before, strict=True):
        texts.update(run.outputs)
        texts[f"proc-{snap.pid}.txt"] = render_proc(snap, redactor)
    texts["log-tail.txt"] = "\n".join(req.log_tail) + ("\n" if req.log_tail else "")
    texts.update(sglang_files(req))
    blobs = {name: redactor.text(text).encode() for name, text in texts.items()}
    blobs["env.json"] = _json(redactor.env(req.env))
    blobs["nvml.json"] = _json(redactor.obj(gpu_doc(req.gpu, req.gpm)))
    blobs["verdict.json"] = _json(redactor.obj(dict(req.verdict)))
    return blobs


async def _store(
    diag_dir: Path, bundle_id: str, blobs: dict[str, bytes], keep: int, max_bytes: int
) -> tuple[Path | None, str | None, list[str], list[str]]:
    """(path, write error, bundles removed by retention, retention errors)."""
    try:
        path = await asyncio.to_thread(write_bundle, diag_dir, bundle_id, blobs)
    except OSError as err:
        return None, f"cannot write bundle {bundle_id} under {diag_dir}: {err}", [], []
    removed, errors = await asyncio.to_thread(enforce_retention, diag_dir, keep, max_bytes, bundle_id)
    return path, None, removed, errors


async def capture(
    req: CaptureRequest,
    diag_dir: Path,
    *,
    keep: int,
    max_bytes: int,
    py_spy_path: str | None = None,
    gdb_path: str | None = None,
    resume: Resume | None = None,
) -> BundleResult:
    """Capture evidence of every process in `req`, classify it, write one bundle; never raises for
    a missing tool, a refused ptrace, a timeout or a failed write: those are in the result."""
    start = time.monotonic()
    diag_dir = Path(diag_dir)
    got = await _collect(req, tools.resolve(py_spy_path, gdb_path), resume)
    redactor = _redactor(req, got.before)
    evidence = _evidence(req, got.runs, got)
    tree_pids = [p.pid for p in req.processes]
    ras = got.ras or RasReport("absent", "", "not asked")
    found = findings(ras, tree_pids)
    classification = with_ras(classify(evidence), found)
    fr = got.fr or FrReport("off", "not asked")
    lost = {r for f in found for r in f.missing_ranks} | _fr_lost(fr)
    missing_pids = [p.pid for p in evidence.processes if p.rank is not None and p.rank in lost]
    held = held_from(req.verdict)
    dead = died_culprit(req.log_tail, lost_pids(req.verdict), held) if req.cause == "rank_died" else None
    named = culprits(evidence, held, missing_pids or never_joined(classification), dead)

    blobs = await asyncio.to_thread(_files, req, got, redactor)  # redacting MBs of dumps: off the loop
    if ras.raw:
        blobs["ras.json"] = redactor.text(ras.raw).encode()
    fr_files = await asyncio.to_thread(bundle_files, fr)
    if "fr-trace.txt" in fr_files:  # torch's analyzer prints frames and names: redacted like any text
        fr_files["fr-trace.txt"] = redactor.text(fr_files["fr-trace.txt"].decode("utf-8", "replace")).encode()
    blobs.update(fr_files)
    names = [*blobs, "summary.json", "summary.txt"]
    bundle_id = unique_id(diag_dir, safe_id(req.incident_id))
    records = [
        ProcRecord(
            r.info,
            s.alive,
            s.listening,
            tuple(n for n in names if n.endswith(f"-{s.pid}.txt")),
            len(s.threads),
        )
        for r, s in zip(got.runs, got.before, strict=True)
    ]
    outcomes = tuple(o for r in got.runs for o in r.outcomes)
    errors = [e for r in got.runs for e in r.errors] + [f"pid {s.pid}: {e}" for s in got.before for e in s.errors]
    durations = {**got.durations, "capture_s": round(time.monotonic() - start, 4)}
    created = req.created_at if req.created_at is not None else time.time()
    summary = build_summary(
        req,
        bundle_id,
        created,
        evidence,
        classification,
        records,
        outcomes,
        durations,
        errors,
        names,
        redactor,
        named,
    )
    ras_view, coll = ras_doc(ras, tree_pids), collective_doc(classification, found)
    ranks = [p.pid for p in evidence.processes if p.rank_like]
    sampling = sample_spread({r.info.pid: r.first_at for r in got.runs if r.first_at}, ranks)
    summary.update(ras=redactor.obj(ras_view), collective=redactor.obj(coll), sampling=sampling)
    summary["flight_recorder"] = redactor.obj(fr.doc())
    summary["gpu_xids"] = [dict(x) for x in req.gpu_xids]
    if req.group is not None:
        summary["group"] = dict(req.group)
    blobs["summary.json"] = _json(summary)
    text = render_text(summary, evidence, redactor).splitlines()
    extra = [*ras_text(ras_view, coll), *fr.lines(), spread_text(sampling)]
    if req.gpu_xids:
        extra += ["", "GPU faults (Xid):", *[f"  {x.get('at')} {x.get('text')}" for x in req.gpu_xids]]
    if req.group is not None:
        extra += group_text(req.group)
    blobs["summary.txt"] = ("\n".join(text + [redactor.text(x) for x in extra]) + "\n").encode()

    path, error, removed, retention_errors = await _store(diag_dir, bundle_id, blobs, keep, max_bytes)
    total = time.monotonic() - start
    final = {
        **summary,
        "durations": {**durations, "total_s": round(total, 4)},
        "errors": [*errors, *retention_errors, *([error] if error else [])],
        "path": str(path) if path else None,
        "removed": removed,
    }
    rank_pids = [p.pid for p in req.processes if p.role in ("scheduler", "pending")]
    return BundleResult(
        bundle_id,
        path,
        classification.hang_class if req.trigger == "hung" else None,
        classification,
        total,
        outcomes,
        error,
        final,
        tuple(removed),
        fr_trace=trace_job(fr, path, req.env, rank_pids, req.argv, redactor.text),
    )
