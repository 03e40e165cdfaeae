"""Running one tool against one process: its time budget, its outcome, its file in the bundle."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from probes.types import GpuObservation, ProcInfo
from supervisor.common.toolproc import RunResult, run_tool
from supervisor.diagnostics import tools
from supervisor.diagnostics.capturerecords import CaptureRequest, Outcome, StackThread, ToolName, ToolOutcome
from supervisor.diagnostics.pystack import parse_pystack, pystack_argv

Resume = Callable[[Sequence[int]], object]
_MIN_TOOL_S = 0.3  # a tool given less than this cannot attach and dump: skipped instead
_FILE_PREFIX: dict[ToolName, str] = {
    "py-spy": "pyspy",
    "py-spy-native": "pyspy-native",
    "gdb": "gdb",
    "cuda-gdb": "gdb",
    "pystack": "pystack",
    "pystack-gil": "pystack-gil",
    "pystack-native": "pystack-native",
}


@dataclass
class ProcRun:
    info: ProcInfo
    outcomes: list[ToolOutcome] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)  # file name -> raw text, redacted on write
    python: tuple[StackThread, ...] = ()
    native: tuple[StackThread, ...] = ()
    kernels: tuple[str, ...] = ()
    errors: list[str] = field(default_factory=list)
    first_at: float | None = None  # monotonic time its first stack tool started: the "sample" instant


async def _call_resume(resume: Resume | None, pid: int, run: ProcRun) -> None:
    if resume is None:
        return
    try:
        result = resume([pid])
        if inspect.isawaitable(result):
            await result
    except Exception as err:  # the daemon's callable failing must not lose the evidence
        run.errors.append(f"pid {pid}: resume failed: {err}")


def _outcome(pid: int, tool: ToolName, res: RunResult) -> ToolOutcome:
    if res.missing:
        return ToolOutcome(pid, tool, "missing", res.duration_s, detail=res.stderr.strip())
    outcome: Outcome = "timeout" if res.timed_out else tools.judge(tool, res.exit_code, res.stdout, res.stderr)
    tail = res.stderr.strip().splitlines()[-3:]
    return ToolOutcome(
        pid=pid,
        tool=tool,
        outcome=outcome,
        duration_s=round(res.duration_s, 4),
        bytes=res.bytes,
        exit_code=res.exit_code,
        file=f"{_FILE_PREFIX[tool]}-{pid}.txt",
        detail="" if outcome == "ok" else " | ".join(tail)[:500],
        truncated=res.truncated,
    )


def _file_text(res: RunResult, argv: tuple[str, ...], outcome: ToolOutcome) -> str:
    head = f"# {' '.join(argv)}\n# outcome {outcome.outcome}, exit {res.exit_code}, {res.duration_s:.2f} s\n"
    if res.truncated:
        head += f"# output truncated to the first {len(res.stdout.encode())} of {res.bytes} bytes\n"
    body = res.stdout
    if res.stderr.strip():
        body += f"\n== stderr ==\n{res.stderr}"
    return head + body


async def run_one(
    run: ProcRun,
    tool: ToolName,
    argv: tuple[str, ...],
    timeout_s: float,
    env: dict[str, str],
    resume: Resume | None,
    deadline: float,
) -> RunResult:
    if not os.path.exists(f"/proc/{run.info.pid}"):
        run.outcomes.append(ToolOutcome(run.info.pid, tool, "gone", 0.0, detail="the process had exited"))
        return RunResult(None, "", "", 0.0)
    left = deadline - time.monotonic()
    if left < _MIN_TOOL_S:
        why = "not run: the capture's time budget ([diagnostics] budget) was spent"
        run.outcomes.append(ToolOutcome(run.info.pid, tool, "skipped", 0.0, detail=why))
        return RunResult(None, "", "", 0.0)
    if run.first_at is None:
        run.first_at = time.monotonic()
    res = await run_tool(argv, min(timeout_s, left), env=env)
    out = _outcome(run.info.pid, tool, res)
    if out.outcome == "missing":
        run.outcomes.append(ToolOutcome(run.info.pid, tool, "missing", out.duration_s, detail=out.detail))
        return res
    await _call_resume(resume, run.info.pid, run)
    run.outcomes.append(out)
    assert out.file is not None
    run.outputs[out.file] = _file_text(res, argv, out)
    return res


async def gil_look(
    run: ProcRun, req: CaptureRequest, exe: tuple[str, ...], env: dict[str, str], deadline: float
) -> None:
    """Which thread holds the GIL, where py-spy did not say: pystack reads it from the interpreter
    without pausing the process (`--no-block`, about 0.15 s). py-spy marks `+gil` only on an active
    thread; a thread asleep in native code with the GIL held (ctypes.PyDLL, a C extension that never
    releases it: nvidia-resiliency-ext's LOCK_GIL) reads `idle` there, and is the rank's culprit."""
    if any("gil" in t.status.lower() for t in run.python):
        return
    argv = pystack_argv(exe, run.info.pid, native=False, nonblocking=True)
    res = await run_one(run, "pystack-gil", argv, req.py_spy_timeout_s, env, None, deadline)
    holder = next((t.tid for t in parse_pystack(res.stdout) if "gil" in t.status.lower()), None)
    if holder is None:
        return
    if not run.python:  # py-spy read nothing: pystack's own frames stand in
        run.python = parse_pystack(res.stdout)
    run.python = tuple(replace(t, status=f"{t.status}+gil") if t.tid == holder else t for t in run.python)


def task_ids(pid: int, proc_root: str = "/proc") -> frozenset[int]:
    """The process's threads as the kernel lists them (empty when it cannot be read)."""
    try:
        return frozenset(int(t) for t in os.listdir(f"{proc_root}/{pid}/task") if t.isdigit())
    except OSError:
        return frozenset()


def gdb_adds_nothing(run: ProcRun, kind: ToolName, spy_named: bool, tasks: frozenset[int]) -> str | None:
    """Why a plain gdb backtrace would add nothing to this process's evidence, or None when it would.

    It adds nothing where `py-spy --native` named the native frames of every thread the kernel lists
    for the process: each thread's native stack is then already in the bundle, beside its Python
    frames. A thread py-spy does not list (no Python thread state: NCCL's, CUDA's, a tokenizer's
    Rust pool) has no stack but gdb's, so gdb runs; so does cuda-gdb, for the GPU's kernels. Skipping
    it where it is redundant is most of the daemon's share of an outage on a loaded host (issue 36):
    gdb reads every library's symbols for 2-3 s a process."""
    if kind != "gdb" or not spy_named or not tasks:
        return None
    listed = {t.tid for t in run.python if t.tid is not None}
    if not tasks <= listed:
        return None
    return (
        f"py-spy --native named the native frames of all {len(tasks)} thread(s) the kernel lists: "
        "a gdb backtrace would repeat them"
    )


def idle_gpus(pid: int, gpu: GpuObservation | None) -> tuple[int, ...]:
    """The GPUs this process holds memory on, when NVML read 0 % utilisation on every one of them at
    the verdict; else empty. A kernel resident on a GPU (running, spinning on a flag, waiting in a
    collective) keeps its utilisation at 100 %, so at 0 % cuda-gdb has no kernel to name there. A GPU
    whose utilisation NVML could not read (a MIG slice) is never taken for idle."""
    if gpu is None or gpu.status != "ok":
        return ()
    held = {p.gpu_index for p in gpu.processes if p.pid == pid}
    read = {d.index: d.util_percent for d in gpu.devices if d.util_read}
    if not held or any(read.get(i, 1.0) > 0 for i in held):
        return ()
    return tuple(sorted(held))


async def host_frames_instead_of_cuda_gdb(
    run: ProcRun,
    req: CaptureRequest,
    exe: tuple[str, ...],
    env: dict[str, str],
    resume: Resume | None,
    deadline: float,
    gpus: Sequence[int],
) -> str | None:
    """Why cuda-gdb can be skipped for a process on idle GPUs, or None when it must run.

    cuda-gdb's attach costs 2 to 11 s per GPU process (H100, H200; most of a hang's bundle) and adds
    two things: the resident kernels and the native stacks of threads with no Python state. On idle
    GPUs there is no kernel to name, and `pystack --native-all` (about 0.3 s) names every thread's
    native frames, those threads' included, with the libraries' exported symbols (cuda-gdb, asked
    not to read the libraries' symbols, prints `??` there). Where pystack misses a thread the kernel
    lists, or fails, cuda-gdb runs as before."""
    argv = pystack_argv(exe, run.info.pid, native=True, every_thread=True)
    res = await run_one(run, "pystack-native", argv, req.py_spy_timeout_s, env, resume, deadline)
    threads = parse_pystack(res.stdout)
    tasks = task_ids(run.info.pid)
    named = {t.tid for t in threads if t.frames}
    if not threads or not tasks or not tasks <= named:
        return None
    # The native view, as gdb's would be: each thread's C frames (the Python ones are py-spy's).
    run.native = tuple(replace(t, frames=tuple(f for f in t.frames if not f.is_python)) for t in threads)
    where = ", ".join(str(i) for i in gpus)
    return (
        f"NVML read 0 % utilisation on GPU {where}: no kernel was resident for cuda-gdb to name, and "
        f"pystack --native-all named the native frames of all {len(tasks)} thread(s) the kernel lists"
    )


def missing_tool(pid: int, tool: ToolName, what: str) -> ToolOutcome:
    return ToolOutcome(pid, tool, "missing", 0.0, detail=f"{what} not found (install it, or set [diagnostics] path)")


async def read_pystack(
    run: ProcRun,
    req: CaptureRequest,
    exe: tuple[str, ...],
    env: dict[str, str],
    resume: Resume | None,
    deadline: float,
) -> bool:
    """The Python (and, where asked, native) frames of a process py-spy cannot read; True when
    native frames came with their names, so cuda-gdb can skip the libraries' symbols."""
    argv = pystack_argv(exe, run.info.pid, native=req.native, nonblocking=req.nonblocking)
    res = await run_one(run, "pystack", argv, req.py_spy_timeout_s, env, resume, deadline)
    threads = parse_pystack(res.stdout)
    if threads:
        run.python = threads
    return bool(threads) and req.native and not req.nonblocking
