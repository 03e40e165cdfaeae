"""How the server hangs, from the evidence: a pure function, so a rung can be chosen by it.

Precedence, first match wins (DIAGNOSTICS.md explains why):
cuda_graph_capture > collective > io_wait > busy_spin > idle_deadlock > unknown.

Busy or idle is judged from the schedulers when the tree has them: the HTTP front end keeps
burning a core for its clients while a scheduler is stopped or deadlocked, and that core says
nothing about where the model's work hangs. A scheduler stopped by a signal (state T before any
tool attached) runs nothing: it is named first and counts as idle. So does any other process of
the tree that is stopped (issue 51): with the front end or the detokenizer stopped, the schedulers
turn their loops with nothing to take, and that core is not the hang: the stop is, so
`idle_deadlock` ranks before `busy_spin` then. A tree whose schedulers all
exited (a detokenizer left, no rank) is `unknown`: busy or idle would describe the front end only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from supervisor.diagnostics.capturerecords import Classification, Evidence, Frame, ProcEvidence, StackThread
from supervisor.diagnostics.waits import ThreadView, thread_views
from supervisor.status.causes import HangClass

_GRAPH_FUNC = re.compile(
    r"capture_one_batch_size|[A-Za-z]*CudaGraphRunner\.(?:capture\w*|__init__)\b"
    r"|cudaStreamBeginCapture|cudaStreamEndCapture|cudaGraphInstantiate|cuStreamBeginCapture"
    r"|CUDAGraph\.capture_(?:begin|end)|^graph\.__(?:enter|exit)__$"
)
_GRAPH_FILE = re.compile(r"torch/cuda/graphs\.py")
_COLL_FUNC = re.compile(
    r"nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|c10d::|ProcessGroupNCCL|cross_device_reduce",
    re.IGNORECASE,
)
_COLL_DIST = re.compile(r"^(?:broadcast\w*|barrier|monitored_barrier|send|recv|isend|irecv|gather|scatter|reduce)$")
_COLL_FILE = re.compile(r"libnccl|torch/distributed/|sglang/srt/distributed/")
_PY_WINDOW = 8  # Python frames, innermost first, that still count as "where it waits"
_NATIVE_ONLY_WINDOW = 40
_MAX_FRAMES = 40


@dataclass(frozen=True)
class _Finding:
    reasons: tuple[str, ...]
    frames: tuple[str, ...]


def _n(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s" if not word.endswith("s") else f"{count} {word}es"


def _stacks(view: ThreadView) -> tuple[StackThread, ...]:
    return tuple(s for s in (view.python, view.native) if s is not None)


def _window(stack: StackThread) -> tuple[Frame, ...]:
    out: list[Frame] = []
    seen_py = 0
    for f in stack.frames:
        out.append(f)
        seen_py += f.is_python
        if seen_py >= _PY_WINDOW:
            break
    return tuple(out) if seen_py else stack.frames[:_NATIVE_ONLY_WINDOW]


def _at(view: ThreadView, f: Frame) -> str:
    where = f" ({f.where})" if f.file else ""
    return f"{view.proc}: thread '{view.name or '?'}' (tid {view.tid}) in {f.function}{where}"


def _graph_capture(views: list[ThreadView], ev: Evidence) -> _Finding | None:
    frames: list[str] = []
    for v in views:
        for stack in _stacks(v):
            hit = next(
                (f for f in stack.frames if _GRAPH_FUNC.search(f.function) or _GRAPH_FILE.search(f.file)),
                None,
            )
            if hit is not None:
                frames.append(_at(v, hit))
                break
    reasons = []
    if frames:
        reasons.append(f"{_n(len(frames), 'thread')} inside CUDA graph capture")
    if ev.phase == "capturing_graphs":
        reasons.append("the stall came in phase capturing_graphs (after 'Capture cuda graph begin')")
    return _Finding(tuple(reasons), tuple(frames)) if reasons else None


def _is_collective(f: Frame) -> bool:
    if _COLL_FUNC.search(f.function) or "libnccl" in f.file:
        return True
    short = f.function.rsplit(".", 1)[-1].rsplit("::", 1)[-1]
    return bool(_COLL_DIST.match(short) and _COLL_FILE.search(f.file))


def _collective(views: list[ThreadView], ev: Evidence) -> _Finding | None:
    frames: list[str] = []
    for v in views:
        if v.background:
            continue
        for stack in _stacks(v):
            hits = [f for f in _window(stack) if _is_collective(f)]
            if hits:
                # The Python call (torch.distributed.all_reduce) says more than the NCCL symbol under it.
                frames.append(_at(v, next((f for f in hits if f.is_python), hits[0])))
                break
    kernels = [f"pid {p.pid}: GPU kernel {k}" for p in ev.processes for k in p.gpu_kernels if "nccl" in k.lower()]
    if not frames and not kernels:
        return None
    procs = len({line.split(":", 1)[0] for line in frames})
    reasons = []
    if frames:
        reasons.append(f"{_n(len(frames), 'thread')} in {_n(procs, 'process')} wait in an NCCL/c10d collective")
    if kernels:
        reasons.append(f"{_n(len(kernels), 'NCCL kernel')} resident on the GPU")
    missing = _missing_ranks(views, ev)
    if missing:
        reasons.append(missing)
    return _Finding(tuple(reasons), tuple(frames + kernels))


def _missing_ranks(views: list[ThreadView], ev: Evidence) -> str:
    """Which scheduler ranks are *not* in a collective: the ones the others wait for."""
    ranks = [p for p in ev.processes if p.role == "scheduler" and p.rank is not None]
    if len(ranks) < 2:
        return ""
    inside: set[int] = set()
    for v in views:
        if v.background:
            continue
        if any(_is_collective(f) for stack in _stacks(v) for f in _window(stack)):
            inside.add(v.pid)
    absent = [p for p in ranks if p.pid not in inside]
    if not absent or len(absent) == len(ranks):
        return ""
    waiting = ", ".join(f"TP{p.rank}" for p in ranks if p.pid in inside)
    away = ", ".join(f"TP{p.rank} (pid {p.pid})" for p in absent)
    return f"ranks {waiting} wait in the collective; {away} never joined it: the rank(s) the others wait for"


def _io_wait(views: list[ThreadView], ev: Evidence) -> _Finding | None:
    reasons: list[str] = []
    frames: list[str] = []
    for p in ev.processes:
        mine = [v for v in views if v.pid == p.pid and v.states]
        in_d = [v for v in mine if v.state == "D"]
        main = next((v for v in mine if v.tid == p.pid), None)
        main_stuck = main is not None and all(s == "D" for s in main.states)
        if in_d and (main_stuck or 2 * len(in_d) >= len(mine)):
            reasons.append(f"{p.label}: {len(in_d)} of {len(mine)} threads in D state (uninterruptible)")
            frames += [v.sentence() for v in in_d]
    return _Finding(tuple(reasons), tuple(frames)) if reasons else None


def _ranks(ev: Evidence) -> tuple[ProcEvidence, ...]:
    return tuple(p for p in ev.processes if p.rank_like)


def _rank_views(views: list[ThreadView], ev: Evidence) -> list[ThreadView]:
    """The schedulers' threads when the tree has schedulers, else every thread."""
    pids = {p.pid for p in _ranks(ev)}
    return [v for v in views if v.pid in pids] if pids else views


def _ranks_gone(ev: Evidence) -> bool:
    """An SGLang tree (its detokenizer is there) with no scheduler left: every rank died. The HTTP
    front end's core is all that burns, and it says nothing about how the model's work ended."""
    return not _ranks(ev) and any(p.role == "detokenizer" for p in ev.processes)


def _cpu_reason(ev: Evidence) -> str | None:
    ranks = _ranks(ev)
    rates = [p.cpu_cores for p in ranks]
    if ranks and all(r is not None for r in rates):
        cores = sum(r for r in rates if r is not None)
        if cores >= ev.busy_cpu_cores:
            return f"schedulers' CPU {cores:.2f} cores >= {ev.busy_cpu_cores:g}"
        return None
    if ev.tree_cpu_cores is not None and ev.tree_cpu_cores >= ev.busy_cpu_cores:
        return f"tree CPU {ev.tree_cpu_cores:.2f} cores >= {ev.busy_cpu_cores:g}"
    return None


def _stopped(ev: Evidence) -> _Finding | None:
    stopped = [p for p in ev.processes if p.stopped]
    if not stopped:
        return None
    names = ", ".join(p.label for p in stopped)
    reason = f"{names} stopped (state T before any tool attached: SIGSTOP or a debugger); it runs no code"
    return _Finding((reason,), tuple(f"{p.label}: stopped (state T)" for p in stopped))


def _busy(views: list[ThreadView], ev: Evidence) -> _Finding | None:
    if _ranks_gone(ev):
        return None
    reasons: list[str] = []
    cpu = _cpu_reason(ev)
    if cpu is not None:
        reasons.append(cpu)
    if ev.gpu_util_percent is not None and ev.gpu_util_percent >= ev.busy_gpu_percent:
        reasons.append(f"GPU util {ev.gpu_util_percent:.0f} % >= {ev.busy_gpu_percent:g} %")
    looping = [v for v in _rank_views(views, ev) if v.looping]
    if looping:
        reasons.append(
            f"{_n(len(looping), 'thread')} running Python code in {len(looping[0].states)} successive samples"
        )
    return _Finding(tuple(reasons), tuple(v.sentence() for v in looping)) if reasons else None


def _idle(views: list[ThreadView], ev: Evidence) -> _Finding | None:
    if _ranks_gone(ev):
        return None
    mine = _rank_views(views, ev)
    locked = [v for v in mine if v.kind == "lock" and not v.background]
    stopped = [p for p in _ranks(ev) if p.stopped]
    others = [p for p in ev.processes if p.stopped and not p.rank_like]
    if others:  # a stopped front end or detokenizer: the ranks' loops turn with nothing to take
        stopped += others
        locked = [] if any(v.kind == "running" for v in mine) else locked
    elif (not locked and not stopped) or any(v.kind == "running" for v in mine):
        return None
    reasons = [f"{p.label} is stopped: nothing in it runs" for p in stopped]
    if locked:
        procs = len({v.pid for v in locked})
        what = "wait on locks (futex, condition, Lock.acquire), none runs"
        reasons.append(f"{_n(len(locked), 'thread')} in {_n(procs, 'process')} {what}")
    frames = [f"{p.label}: stopped (state T)" for p in stopped] + [v.sentence() for v in locked]
    return _Finding(tuple(reasons), tuple(frames))


def _figures(ev: Evidence) -> str:
    cpu = "unknown" if ev.tree_cpu_cores is None else f"{ev.tree_cpu_cores:.2f} cores"
    gpu = "unknown" if ev.gpu_util_percent is None else f"{ev.gpu_util_percent:.0f} %"
    return f"tree CPU {cpu}, GPU util {gpu}, phase {ev.phase or 'unknown'}"


def classify(evidence: Evidence) -> Classification:
    """The hang class with the reasons and frames that support it; pure, no I/O."""
    views = [v for p in evidence.processes for v in thread_views(p)]
    busy = _busy(views, evidence)
    rules: list[tuple[HangClass, _Finding | None]] = [
        ("cuda_graph_capture", _graph_capture(views, evidence)),
        ("collective", _collective(views, evidence)),
        ("io_wait", _io_wait(views, evidence)),
        ("busy_spin", busy),
        ("idle_deadlock", None if busy else _idle(views, evidence)),
    ]
    if any(p.stopped and not p.rank_like for p in evidence.processes):
        # A stopped front end or detokenizer is the hang; the ranks' CPU is their idle loop (issue 51).
        rules[3:] = [("idle_deadlock", _idle(views, evidence)), ("busy_spin", busy)]
    matched = [(cls, f) for cls, f in rules if f is not None]
    figures = _figures(evidence)
    if not matched:
        kinds = sorted({v.kind for v in views})
        why = f"no rule matched ({len(views)} threads seen; wait kinds: {', '.join(kinds) or 'none'})"
        if _ranks_gone(evidence):
            why = "no scheduler is left (every rank exited): the front end's CPU says nothing about the model's work"
        stopped_first = _stopped(evidence)
        head = stopped_first.reasons if stopped_first else ()
        return Classification("unknown", (*head, why, figures), (), ("unknown",))
    cls, finding = matched[0]
    also = [c for c, _ in matched[1:]]
    stopped = _stopped(evidence)
    first = tuple(r for r in (stopped.reasons if stopped else ()) if r not in finding.reasons)
    reasons = [*first, *finding.reasons, figures]
    if also:
        reasons.append(f"also matched, lower precedence: {', '.join(also)}")
    return Classification(cls, tuple(reasons), finding.frames[:_MAX_FRAMES], tuple(c for c, _ in matched))
