"""Where each thread waits: py-spy frames, gdb frames and /proc samples joined by thread id."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from probes.types import ThreadInfo
from supervisor.diagnostics.capturerecords import Frame, ProcEvidence, StackThread

WaitKind = Literal[
    "lock",  # futex, mutex, condition variable, semaphore, Lock.acquire, Thread.join, Queue.get
    "sleep",  # time.sleep / nanosleep: a heartbeat, not a hang
    "io",  # sockets, pipes, epoll, select (a ZMQ receive waits here)
    "gpu",  # a CUDA synchronize call waiting on the device
    "disk",  # state D: uninterruptible, usually I/O or a driver call
    "running",  # state R with py-spy calling it active
    "stopped",  # state T before any tool attached: SIGSTOP, runs no code until SIGCONT
    "other",  # none of the above could be told
]

_NATIVE_LOCK = re.compile(
    r"PyThread_acquire_lock|pthread_cond_(?:timed|clock)?wait|__lll_lock_wait|pthread_mutex_(?:timed)?lock"
    r"|sem_(?:timed|clock)?wait|futex_wait|futex_abstimed|do_futex_wait|condition_variable::wait"
    r"|pthread_rwlock_\w*lock|pthread_join|__pthread_clockjoin"
)
_NATIVE_SLEEP = re.compile(r"nanosleep|\bsleep\b|usleep|time_sleep|pysleep")
_NATIVE_IO = re.compile(r"epoll_wait|\bpoll\b|__poll|\bselect\b|recv|\bread\b|__libc_read|accept|zmq_")
_NATIVE_GPU = re.compile(r"cu(?:da)?(?:Stream|Device|Event|Ctx)Synchroni[sz]e|cuStreamQuery|libcuda")
_PY_LOCK = frozenset({"acquire", "wait", "join", "_wait_for_tstate_lock", "get", "wait_for", "result", "put"})
_PY_SLEEP = frozenset({"sleep"})
_PY_IO = frozenset(
    {
        "select",
        "poll",
        "recv",
        "recv_pyobj",
        "recv_multipart",
        "accept",
        "read",
        "readline",
        "recv_into",
        "_recv",
        "_run_once",
    }
)
_WCHAN_SLEEP = re.compile(r"nanosleep|hrtimer|schedule_timeout")
_WCHAN_IO = re.compile(r"poll|select|sk_wait|sock|unix_stream|tcp_|pipe_|wait_woken|skb")
# Stdlib synchronisation code: a person wants the caller's line too.
_SYNC_FILES = ("threading.py", "queue.py", "selectors.py", "socket.py")
_SYNC_DIRS = ("multiprocessing/", "concurrent/futures/", "asyncio/")
# Helper threads that every NCCL process has, always waiting: they say nothing about a hang. The
# TCPStore daemon (`pt_tcpstore_uv`) sits in c10d code in every torch.distributed process.
_BACKGROUND = re.compile(
    r"watchdog|heartbeat_?monitor|ncclproxy|proxyservice|proxyprogress|ncclasync|"
    r"LibUVStoreDaemon|TCPStoreMasterDaemon|TCPStoreWorkerDaemon",
    re.I,
)
_BACKGROUND_NAMES = re.compile(r"^pt_nccl_|^pt_autograd_|^pt_tcpstore")
# gloo's work thread idles in its run loop between collectives; inside one it runs a `...Work` frame.
_GLOO_IDLE = re.compile(r"ProcessGroupGloo::runLoop")
_GLOO_WORK = re.compile(r"Work::|allreduce|all_reduce|broadcast|allgather|reduce_scatter|barrier", re.I)
# How deep a thread's innermost frames still count as "where it waits".
NATIVE_WINDOW = 14


@dataclass(frozen=True)
class ThreadView:
    pid: int
    proc: str  # "scheduler TP0 pid 1234"
    tid: int | None
    name: str
    states: tuple[str, ...]  # the thread's state letter in each /proc sample, oldest first
    wchan: str
    python: StackThread | None
    native: StackThread | None
    kind: WaitKind
    label: str  # what it waits in: "acquire", "futex_do_wait", "spin_forever", ...
    site: Frame | None  # innermost Python frame
    caller: Frame | None  # the first frame outside stdlib sync code, when `site` is inside it

    @property
    def state(self) -> str:
        return self.states[-1] if self.states else ""

    @property
    def background(self) -> bool:
        """An NCCL watchdog, heartbeat or proxy thread: waits by design."""
        if _BACKGROUND_NAMES.match(self.name):
            return True
        frames = [f for s in (self.python, self.native) if s is not None for f in s.frames]
        if any(_BACKGROUND.search(f.function) for f in frames):
            return True
        gloo_idle = any(_GLOO_IDLE.search(f.function) for f in frames)
        return gloo_idle and not any(_GLOO_WORK.search(f.function) for f in frames)

    @property
    def looping(self) -> bool:
        """Running in every sample (at least two) with Python code on top."""
        return self.kind == "running" and len(self.states) >= 2 and self.site is not None

    def sentence(self) -> str:
        """`scheduler TP0 pid 12: thread 'x' waits in acquire at runner.py:88 (sync) [tid 13, S futex]`."""
        who = f"{self.proc}: thread '{self.name or '?'}'"
        verb = {"running": "runs", "sleep": "sleeps", "disk": "is in D state"}.get(self.kind, "waits")
        verb += f" in {self.label}" if self.label else ""
        if self.kind == "stopped":
            verb = "is stopped (state T: SIGSTOP or a debugger)"
        where = ""
        if self.site is not None:
            where = f" at {self.site.where} ({self.site.function})"
            if self.caller is not None:
                where += f" called from {self.caller.where} ({self.caller.function})"
        elif self.native and self.native.frames:
            named = [
                f for f in self.native.frames if f.function == self.label or _lock_label(f) == self.label
            ]
            top = named[-1] if named else self.native.frames[0]
            where = f" at {top.function}" + (f" ({top.where})" if top.file else "")
        tid = f"tid {self.tid}" if self.tid is not None else "tid ?"
        state = " ".join(x for x in (self.state, self.wchan) if x and x != "0")
        return f"{who} {verb}{where} [{tid}{', ' + state if state else ''}]"


def native_window(thread: StackThread) -> tuple[Frame, ...]:
    """Native frames above the first Python frame, else the innermost few."""
    out: list[Frame] = []
    for f in thread.frames:
        if f.is_python:
            return tuple(out)
        out.append(f)
    return tuple(out[:NATIVE_WINDOW])


def _lock_label(frame: Frame) -> str:
    return "acquire" if "PyThread_acquire_lock" in frame.function else frame.function


def _sites(python: StackThread | None) -> tuple[Frame | None, Frame | None]:
    if python is None:
        return None, None
    py = [f for f in python.frames if f.is_python]
    if not py:
        return None, None
    site = py[0]
    if not _is_sync(site):
        return site, None
    return site, next((f for f in py[1:] if not _is_sync(f)), None)


def _is_sync(f: Frame) -> bool:
    return stdlib_sync_file(f.file)


def stdlib_sync_file(file: str) -> bool:
    """Python's own threading, queue, selector and multiprocessing code: a wait or a thread's
    bootstrap, never the server's."""
    return file in _SYNC_FILES or file.startswith(_SYNC_DIRS) or "/threading.py" in file


def _kind(
    states: tuple[str, ...],
    wchan: str,
    python: StackThread | None,
    native: tuple[Frame, ...],
    site: Frame | None,
) -> tuple[WaitKind, str]:
    state = states[-1] if states else ""
    if state == "D":
        return "disk", wchan or "D state"
    active = python is not None and "active" in python.status
    if state == "R" and (python is None or active):
        return "running", site.function if site else "R state"
    for pattern, kind in (
        (_NATIVE_GPU, "gpu"),
        (_NATIVE_LOCK, "lock"),
        (_NATIVE_SLEEP, "sleep"),
        (_NATIVE_IO, "io"),
    ):
        named = [f for f in native if pattern.search(f.function)]
        if named:
            # The outermost lock frame names the primitive (Lock.acquire, condition_variable::wait).
            return kind, _lock_label(named[-1]) if kind == "lock" else named[0].function  # type: ignore[return-value]
        lib = next((f for f in native if pattern.search(f.file)), None)
        if lib is not None:
            return kind, f"a {lib.file} call"  # type: ignore[return-value]
    if site is not None:
        short = site.function.rsplit(".", 1)[-1]
        for names, kind in ((_PY_LOCK, "lock"), (_PY_SLEEP, "sleep"), (_PY_IO, "io")):
            if short in names:
                return kind, short  # type: ignore[return-value]
    if wchan.startswith("futex"):
        return "lock", wchan
    if _WCHAN_SLEEP.search(wchan):
        return "sleep", wchan
    if _WCHAN_IO.search(wchan):
        return "io", wchan
    if active:
        return "running", site.function if site else "active"
    return "other", wchan if wchan and wchan != "0" else ""


def thread_views(proc: ProcEvidence) -> tuple[ThreadView, ...]:
    """One view per thread that py-spy, gdb or /proc knows of; py-spy's threads first."""
    by_tid_native = {t.tid: t for t in proc.native if t.tid is not None}
    samples: dict[int, list[ThreadInfo]] = {}
    for sample in proc.samples:
        for info in sample:
            samples.setdefault(info.tid, []).append(info)
    order: list[int | None] = [t.tid for t in proc.python]
    order += [t.tid for t in proc.native if t.tid not in order]
    order += [tid for tid in samples if tid not in order]
    py_by_tid = {t.tid: t for t in proc.python}
    views: list[ThreadView] = []
    for tid in order:
        python = py_by_tid.get(tid)
        native = by_tid_native.get(tid) if tid is not None else None
        # A stop by our own tools (t, T) says nothing about the hang: those samples are dropped,
        # unless the process was stopped before any tool attached (then T is the finding).
        kept = ("t",) if proc.stopped else ("t", "T")
        infos = [i for i in samples.get(tid, []) if i.state not in kept] if tid is not None else []
        states = tuple(i.state for i in infos)
        wchan = infos[-1].wchan if infos else ""
        frames = native_window(python) if python is not None else ()
        if native is not None and not any(_NATIVE_LOCK.search(f.function) for f in frames):
            frames = frames + native.frames[:NATIVE_WINDOW]
        site, caller = _sites(python)
        kind: WaitKind
        if proc.stopped and (not states or states[-1] == "T"):
            kind, label = "stopped", "SIGSTOP"
        else:
            kind, label = _kind(states, wchan, python, frames, site)
        name = (
            (python.name if python else "")
            or (infos[-1].name if infos else "")
            or (native.name if native else "")
        )
        views.append(
            ThreadView(
                proc.pid, proc.label, tid, name, states, wchan, python, native, kind, label, site, caller
            )
        )
    return tuple(views)
