"""Name the culprit: per rank, the one thread that stopped the server's progress, and where it is.

A pure reading of the evidence (issue 35). A hung scheduler has dozens of threads (tqdm's monitor,
gloo's run loops, NCCL's watchdog and heartbeat, ZMQ I/O, anonymous driver threads), nearly all
waiting by design; the person on call wants the one that matters first. Per rank, in order:

1. a rank stopped by a signal (state T before any tool attached): its main thread, which runs nothing;
2. the thread that holds the GIL (py-spy's `+gil`): while it sits in native code nobody else runs Python;
3. a thread running Python code (a spin);
4. the main thread, unless it only joins another thread: then the thread it waits for (the first
   non-helper thread in a wait of its own);
5. the first thread that is not a helper.

Across processes the primary culprit is the one the evidence points at, whatever its role (issue
51): candidates are ranked by what their chosen thread shows (`STANDINGS`, strongest first: stopped,
never joined or in D state, holding the GIL in native code, blocked in a lock or a native call,
spinning, waiting on a peer, idle), ranks before other processes of the same standing, then the
lowest rank. Every rank is a candidate; a process that is not a rank (the HTTP front end, the
detokenizer, a controller) only on evidence that cannot be its normal wait (stopped, D state, the
GIL held in native code): their main threads wait in a queue or a selector by design. Helper
threads are folded into a count by kind.

A hang in each role (issue 51), from the evidence of every process at once, with a short `why` on
line 1: a front end whose event loop does not turn (a frame of its own code above the loop's
frames, waiting there: "event loop blocked in f"); a detokenizer blocked in a lock or native call
in its own code, not in its receive ("holds the requests: blocked in f"); a rank idle in its loop
while the other ranks wait in a collective (SGLang #33289: the rank whose decision skipped the
collective, "idle while rank 0 waits in all_reduce: skipped the collective").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from supervisor.diagnostics.capturerecords import Classification, Evidence, Frame, ProcEvidence
from supervisor.diagnostics.waits import ThreadView, stdlib_sync_file, thread_views

# Helper threads every SGLang scheduler carries, by name (py-spy's or /proc's comm) or frame file.
_HELPERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("tqdm", re.compile(r"tqdm|TMonitor|_monitor", re.I)),
    ("gloo", re.compile(r"gloo", re.I)),
    ("nccl", re.compile(r"nccl|pt_nccl|watchdg|heartbt|proxy", re.I)),
    ("torch", re.compile(r"^pt_|tcpstore|autograd", re.I)),
    ("zmq", re.compile(r"zmq|ZMQbg", re.I)),
    ("watchdog", re.compile(r"watchdog|heartbeat|monitor", re.I)),
    ("cuda", re.compile(r"cuda-?EvtHandlr|cuda|libcudadebugger", re.I)),
    ("reader", re.compile(r"_read_thread|log|stdout|stderr", re.I)),
)
_JOIN = frozenset({"join", "_wait_for_tstate_lock"})
MAX_FRAMES = 6


@dataclass(frozen=True)
class Culprit:
    rank: int | None
    pid: int
    process: str  # "scheduler TP0 pid 1234"
    thread: str  # the thread's name ("?" when no tool named it)
    tid: int | None
    doing: str  # "sleeps in clock_nanosleep", "waits in acquire", "runs", "is stopped (SIGSTOP)"
    frames: tuple[str, ...]  # innermost meaningful first: "init_attention_backends (sitecustomize.py:27)"
    # The verdict's seconds without progress (`since_progress_s`), the same for every rank: not how
    # long this thread has been in this frame, which one stack read per rank cannot tell.
    held_s: float | None
    evidence: tuple[str, ...]  # why this thread, in words
    gil: bool = False  # py-spy said it holds the GIL
    helpers: int = 0  # idle helper threads of this rank folded into a count
    helper_kinds: tuple[tuple[str, int], ...] = ()
    kind: str = ""  # the chosen thread's wait kind (supervisor.diagnostics.waits.WaitKind)
    standing: str = ""  # what the evidence says of it (STANDINGS), set by `culprits`
    # issue 51: a hang in each role. `cue`: "loop" (its event loop does not turn), "holds" (a
    # detokenizer blocked in its own code), "skipped" (a rank idle while the others wait in a
    # collective); `why` says it short, on line 1; `collective` the collective the thread waits in.
    cue: str = ""
    why: str = ""
    collective: str = ""

    def line(self) -> str:
        """`Culprit: scheduler TP0 pid 12 thread 'MainThread' tid 12 sleeps in clock_nanosleep at f (x.py:27) ...`."""
        at = f" at {self.frames[0]}" if self.frames else ""
        caller = self.caller()
        at += f" in {caller}" if caller else ""
        held = f", no progress for {self.held_s:.0f} s" if self.held_s is not None else ""
        gil = ", holding the GIL" if self.gil else ""
        tid = f" tid {self.tid}" if self.tid is not None else ""
        why = f"; {self.why}" if self.why else ""
        return f"Culprit: {self.process} thread '{self.thread}'{tid} {self.doing}{at}{gil}{why}{held}"

    def caller(self) -> str | None:
        """The first Python frame outside the innermost one's file, wrappers (`<locals>`) and Python's
        own threading code (`Thread.run`) skipped: the server's own code that called into the hang
        (`TpModelWorker.init_attention_backends` for a native sleep reached through a patched hook),
        so the first line names where in the server. None for a thread's own target function."""
        if not self.frames:
            return None
        home = _python_file(self.frames[0])
        for f in self.frames[1:]:
            file = _python_file(f)
            if file is not None and file != home and "<locals>" not in f and not stdlib_sync_file(file):
                return f
        return None

    def folded(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in self.helper_kinds)
        return f"{self.helpers} idle helper thread{'' if self.helpers == 1 else 's'} folded" + (
            f" ({kinds})" if kinds else ""
        )

    def doc(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "process": self.process,
            "thread": self.thread,
            "tid": self.tid,
            "doing": self.doing,
            "frames": list(self.frames),
            "held_s": self.held_s,
            "gil": self.gil,
            "evidence": list(self.evidence),
            "helpers": self.helpers,
            "helper_kinds": dict(self.helper_kinds),
            "standing": self.standing or None,
            "why": self.why or None,
            "text": self.line(),
        }


def _python_file(frame: str) -> str | None:
    """`f (dir/x.py:27)` -> `dir/x.py`; None for a native frame (`clock_nanosleep (libc.so.6)`)."""
    where = frame.rsplit(" (", 1)[-1].rstrip(")") if frame.endswith(")") else ""
    file = where.rsplit(":", 1)[0]
    return file if file.endswith(".py") else None


def holds_gil(v: ThreadView) -> bool:
    return v.python is not None and "gil" in v.python.status.lower()


def _frames(v: ThreadView) -> list[Frame]:
    return [f for s in (v.python, v.native) if s is not None for f in s.frames]


def helper_kind(v: ThreadView) -> str | None:
    """The kind of idle helper this thread is, or None when it may be the model's work."""
    if holds_gil(v) or v.kind in ("running", "stopped", "disk"):
        return None
    py_files = " ".join(f.file for f in _frames(v) if f.is_python)
    text = f"{v.name} {py_files} {' '.join(f.function for f in _frames(v))}"
    if v.background:
        return "nccl" if re.search(r"nccl|watchdg|heartbt", text, re.I) else "torch"
    for kind, pattern in _HELPERS:
        if pattern.search(v.name) or pattern.search(py_files):
            return kind
    if v.kind == "sleep" and not _is_main(v):
        return "sleeper"
    if v.site is None and not _is_main(v):
        return "anonymous"  # no Python frame: a driver or library thread
    return None


def _is_main(v: ThreadView) -> bool:
    return v.tid == v.pid or v.name == "MainThread"


def _py(f: Frame) -> str:
    return f"{f.function} ({f.where})" if f.file else f.function


def frames_of(v: ThreadView) -> tuple[str, ...]:
    """Innermost meaningful frames: the Python site (its caller instead when the site is stdlib sync
    code: `selectors.py`, `threading.py`, `queue.py`; the stdlib call is in `doing`), then the
    native frame it waits in, named with its library, then the Python frames that called it."""
    meaningful = v.caller if v.caller is not None else v.site
    out: list[str] = [_py(meaningful)] if meaningful is not None else []
    native = [f for f in _frames(v) if not f.is_python and not f.file.startswith("<")]
    named = [f for f in native if f.function == v.label] or native[:1]
    for f in named[:1]:
        out.append(f"{f.function} ({f.file})" if f.file else f.function)
    if v.python is not None:
        py = [f for f in v.python.frames if f.is_python]
        after = py[py.index(meaningful) + 1 :] if meaningful in py else py
        out += [_py(f) for f in after][: max(0, MAX_FRAMES - len(out))]
    return tuple(dict.fromkeys(out))[:MAX_FRAMES]


def _doing(v: ThreadView) -> str:
    if v.kind == "stopped":
        return "is stopped (state T: SIGSTOP or a debugger)"
    verb = {"running": "runs", "sleep": "sleeps", "disk": "is in D state"}.get(v.kind, "waits")
    native = any(not f.is_python for f in _frames(v))
    if v.label and v.label == v.wchan and not native and holds_gil(v):
        return f"blocks in native code (kernel wait {v.wchan})"  # no native stack was taken
    if v.site is not None and v.caller is not None:
        return f"{verb} in {v.label or v.site.function.rsplit('.', 1)[-1]}"  # "at" names the caller
    if not v.label or (v.site is not None and v.label in (v.site.function, v.site.function.rsplit(".", 1)[-1])):
        return verb  # the frame after "at" names it
    return f"{verb} in {v.label}"


def _same_place(v: ThreadView) -> str:
    if len(v.states) >= 2 and len(set(v.states)) == 1:
        return f"state {v.states[0]} in all {len(v.states)} /proc samples"
    return ""


def _pick(views: Sequence[ThreadView], proc: ProcEvidence) -> tuple[ThreadView | None, list[str]]:
    work = [v for v in views if helper_kind(v) is None]
    main = next((v for v in views if v.tid == proc.pid), None)
    main = main or next((v for v in views if v.name == "MainThread"), None)
    if proc.stopped:
        return (main or (views[0] if views else None)), ["the process is stopped by a signal: it runs no code"]
    gil = [v for v in views if holds_gil(v)]
    if gil and gil[0].kind != "running":
        return gil[0], ["it holds the GIL outside Python code: no other thread of the rank can run Python"]
    for v in views:
        callback = loop_callback(v)
        if callback is not None:
            does = "runs in every sample" if v.kind == "running" else "waits"
            return v, [
                f"its event loop does not turn: the callback {_py(callback)} {does} on top of the loop's own"
                " frames, so no request is read or answered and no output is handed on"
            ]
    running = [v for v in work if v.kind == "running"]
    if running:
        spin = "it runs Python code in every sample" if running[0].looping else "it is the thread on a CPU"
        return running[0], [spin + (" and holds the GIL" if holds_gil(running[0]) else "")]
    if main is not None and main in work:
        short = main.site.function.rsplit(".", 1)[-1] if main.site else ""
        if short not in _JOIN and main.label not in _JOIN:
            loop = "the scheduler loop" if proc.rank_like else "the process's own loop"
            return main, [f"it is the {'rank' if proc.rank_like else 'process'}'s main thread, where {loop} runs"]
        others = [v for v in work if v is not main]
        if others:
            more = [f"{o.name} at {frames_of(o)[0]}" for o in others[1:3] if frames_of(o)]
            because = [f"the main thread only joins it (at {frames_of(main)[0] if frames_of(main) else 'join'})"]
            if more:
                because.append(f"{len(others) - 1} other work thread(s) wait too: {'; '.join(more)}")
            return others[0], because
        return main, ["it is the rank's main thread"]
    if work:
        return work[0], ["the first thread that is not an idle helper"]
    if main is not None:
        return main, ["every thread is an idle helper; the main thread stands for the rank"]
    return None, []


# An event loop's own frames (asyncio's; uvloop's are native, below asyncio's runner): under them the
# loop waits in its selector; a frame of other code above them is a callback the loop runs right now.
_LOOP_FUNCS = frozenset({"run_forever", "run_until_complete", "_run_once", "_run", "run"})


def _loop_frame(f: Frame) -> bool:
    return f.is_python and ("asyncio/" in f.file or "uvloop" in f.file) and f.function.rsplit(".", 1)[-1] in _LOOP_FUNCS


def loop_callback(v: ThreadView) -> Frame | None:
    """The callback an event loop in this thread is stuck in: a frame outside Python's own
    synchronisation and loop code above the loop's innermost frame, the thread waiting there (or
    running there in every sample), not in the loop's selector. A turning loop shows none: between
    callbacks its thread waits in `select` right above the loop's frames, and a suspended coroutine
    has no frame on the stack."""
    spins = v.kind == "running" and len(v.states) >= 2 and set(v.states) == {"R"}
    if v.python is None or v.kind == "stopped" or (v.kind == "running" and not spins):
        return None  # a callback caught running once is a loop at work
    py = [f for f in v.python.frames if f.is_python]
    at = next((i for i, f in enumerate(py) if _loop_frame(f)), None)
    if at is None:
        return None
    return next((f for f in py[:at] if not stdlib_sync_file(f.file)), None)


# The collectives ranks wait in together. Not `broadcast`: SGLang's ranks > 0 wait for rank 0's next
# batch in `broadcast_pyobj`, their idle loop.
_COLLECTIVE = re.compile(r"^(?:all_?reduce\w*|all_?gather\w*|reduce_?scatter\w*|all_?to_?all\w*|barrier)$", re.I)
_NCCL_COLLECTIVE = re.compile(r"nccl\w*(?:AllReduce|AllGather|ReduceScatter|AllToAll)", re.I)


def collective_of(v: ThreadView) -> str:
    """The collective this thread waits in (`all_reduce`, `ncclAllReduce`), or ""."""
    for f in _frames(v):
        short = f.function.rsplit(".", 1)[-1].rsplit("::", 1)[-1]
        if (f.is_python and _COLLECTIVE.match(short)) or (not f.is_python and _NCCL_COLLECTIVE.search(short)):
            return short
    return ""


def _own(views: Sequence[ThreadView], proc: ProcEvidence) -> list[ThreadView]:
    """The threads that are this process's own: a stack py-spy read for a thread /proc does not list
    under the pid is another process's (a vfork child shares its parent's memory, so py-spy on the
    child reads the parent's threads); it stands with the process that owns it."""
    tasks = {t.tid for sample in proc.samples for t in sample}
    if not tasks:
        return list(views)
    return [v for v in views if v.tid is None or v.tid in tasks]


# What a candidate's chosen thread shows, strongest first (issue 51). Stopped: it runs nothing until
# SIGCONT. Halted: the rank the others' collective waits for, or a thread the kernel will not wake (D).
# GIL in native code: no other thread of the process runs Python. Blocked: a lock or a native call
# (a CUDA wait). Spins: running code in a loop. Peer: waits for input (a selector, a socket, a pipe).
STANDINGS = ("stopped", "halted", "gil_native", "blocked", "spins", "peer", "idle")
_STRONG = frozenset({"stopped", "halted", "gil_native"})  # enough for a process that is not a rank
_ROLE_WHY = {
    "main": "it is the server's main process (HTTP front end and tokenizer manager): while it is stopped no"
    " request is read or answered, and every health check times out",
    "detokenizer": "it is the detokenizer: no output reaches the front end while it is stopped",
    "controller": "it is the controller between the front end and the ranks: no request reaches a rank",
}


_CUE_WHY = {
    ("loop", "main"): "it is the server's main process (HTTP front end and tokenizer manager): while its event"
    " loop does not turn no request is read or answered, no output reaches a client, and every health check"
    " times out",
    ("holds", "detokenizer"): "it is the detokenizer: every output passes through it to the front end, so while"
    " it is blocked the ranks finish their work and idle and no client, health check included, gets an answer",
}


def _who(proc: ProcEvidence) -> str:
    """`scheduler TP0 pid 12`; the server's main process is named for what it is."""
    return f"front end (main) pid {proc.pid}" if proc.role == "main" else proc.label


def rank_culprit(proc: ProcEvidence, held_s: float | None) -> Culprit | None:
    views = _own(thread_views(proc), proc)
    chosen, why = _pick(views, proc)
    if chosen is None:
        return None
    kinds: dict[str, int] = {}
    for v in views:
        if v is not chosen and (k := helper_kind(v)) is not None:
            kinds[k] = kinds.get(k, 0) + 1
    same = _same_place(chosen)
    cue, why_short = _cue(chosen, proc)
    role_why = _ROLE_WHY.get(proc.role) if proc.stopped else _CUE_WHY.get((cue, proc.role))
    c = Culprit(
        rank=proc.rank,
        pid=proc.pid,
        process=_who(proc),
        thread=chosen.name or "?",
        tid=chosen.tid,
        doing=_doing(chosen),
        frames=frames_of(chosen),
        held_s=held_s,
        evidence=tuple(why + ([role_why] if role_why else []) + ([same] if same else [])),
        gil=holds_gil(chosen),
        helpers=sum(kinds.values()),
        helper_kinds=tuple(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))),
        kind=chosen.kind,
        cue=cue,
        why=why_short,
        collective=collective_of(chosen),
    )
    return replace(c, standing=standing(c, frozenset()))


def _short(f: Frame) -> str:
    return f.function if f.is_python else f.function.rsplit("(", 1)[0]


def _cue(v: ThreadView, proc: ProcEvidence) -> tuple[str, str]:
    """A finding that names a process that is not a rank, and its short why for line 1."""
    if proc.stopped:
        return "", ""
    callback = loop_callback(v)
    if callback is not None:
        return "loop", f"event loop {'spins' if v.kind == 'running' else 'blocked'} in {_short(callback)}"
    # A detokenizer's own wait is its receive from rank 0 (`io`); a lock or a native call in its own
    # code (not in a queue or an event of Python's) holds every request behind it.
    own = v.site is not None and v.caller is None
    if proc.role == "detokenizer" and v.kind in ("lock", "gpu") and own and v.site is not None:
        return "holds", f"holds the requests: blocked in {_short(v.site)}"
    return "", ""


def standing(c: Culprit, missing: frozenset[int]) -> str:
    """What the evidence says of a candidate (one of STANDINGS), from its chosen thread."""
    if c.doing.startswith("is stopped") or c.kind == "stopped":
        return "stopped"
    if c.pid in missing or c.kind == "disk" or c.cue == "skipped":
        return "halted"
    if c.gil and c.kind != "running":
        return "gil_native"
    if c.cue == "loop":
        return "spins" if c.kind == "running" else "blocked"
    if c.kind in ("lock", "gpu") or c.cue == "holds":
        return "blocked"
    if c.kind == "running":
        return "spins"
    if c.kind == "io":
        return "peer"
    return "idle"


def rank_key(c: Culprit, rank_like: bool) -> tuple[int, int, int, int]:
    """The order of candidates: strongest standing, then ranks before other processes, then the
    lowest rank, then the lowest pid."""
    return (
        STANDINGS.index(c.standing or "idle"),
        0 if rank_like else 1,
        c.rank if c.rank is not None else 1 << 20,
        c.pid,
    )


def culprits(
    ev: Evidence, held_s: float | None, missing_pids: Sequence[int] = (), dead: Culprit | None = None
) -> tuple[Culprit, ...]:
    """One culprit per rank, and per other process whose evidence is strong (every process when the
    tree has no rank), primary first; a rank that died (`dead`, from its last words in the log)
    comes before the ranks left waiting for it."""
    has_ranks = any(p.rank_like for p in ev.processes)
    missing = frozenset(missing_pids)
    why = "this rank never joined the collective the other ranks wait in"
    built = [(p, c) for p in ev.processes if (c := rank_culprit(p, held_s)) is not None]
    skipped = _skipped([c for p, c in built if p.rank_like])
    found: list[tuple[Culprit, bool]] = []
    for p, c in built:
        if c.pid in skipped:
            short, long = skipped[c.pid]
            c = replace(c, cue="skipped", why=short, evidence=(long, *c.evidence))
        elif c.pid in missing:
            c = replace(c, evidence=(why, *c.evidence))
        c = replace(c, standing=standing(c, missing))
        if p.rank_like or not has_ranks or c.standing in _STRONG or c.cue in ("loop", "holds"):
            found.append((c, p.rank_like or not has_ranks))
    ranked = tuple(c for c, _ in sorted(found, key=lambda x: rank_key(x[0], x[1])))
    return (dead, *ranked) if dead is not None else ranked


def _ranks_text(ranks: Sequence[int]) -> str:
    """`rank 0`, `ranks 1-3`, `ranks 0, 2`."""
    r = sorted(ranks)
    if len(r) == 1:
        return f"rank {r[0]}"
    if r == list(range(r[0], r[-1] + 1)):
        return f"ranks {r[0]}-{r[-1]}"
    return "ranks " + ", ".join(str(x) for x in r)


def _skipped(ranks: Sequence[Culprit]) -> dict[int, tuple[str, str]]:
    """SGLang #33289's shape: ranks idle in their loops (waiting for input or asleep, in no
    collective) while every other rank waits in a collective. The idle one is the rank whose decision
    skipped it: it runs no forward, so SGLang's own watchdog never dumps it, and it is the one the
    others wait for. A rank that is neither (stopped, blocked elsewhere, spinning) leaves the rule
    unsaid: that rank's own evidence names it. pid -> (the short why, the evidence)."""
    ranked = [c for c in ranks if c.rank is not None]
    waiting = [c for c in ranked if c.collective]
    idle = [c for c in ranked if not c.collective and c.standing in ("peer", "idle")]
    if not waiting or not idle or len(waiting) + len(idle) < len(ranked):
        return {}
    name = Counter(c.collective for c in waiting).most_common(1)[0][0]
    who = _ranks_text([c.rank for c in waiting if c.rank is not None])
    verb = "waits" if len(waiting) == 1 else "wait"
    short = f"idle while {who} {verb} in {name}: skipped the collective"
    long = (
        f"it is idle in its own loop, in no collective, while {who} {verb} in {name}: the rank whose decision"
        " skipped the collective the others wait in (SGLang's watchdog, which watches forwards, never dumps it)"
    )
    return {c.pid: (short, long) for c in idle}


def never_joined(cls: Classification) -> list[int]:
    """The pids the collective rule named as never having joined (\"TP1 (pid 42) never joined\")."""
    return [int(m) for r in cls.reasons if "never joined" in r for m in re.findall(r"\(pid (\d+)\)", r)]


_FATAL = re.compile(r"^Fatal Python error: (.+?)\s*$")
_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+) in (\S+)')
_CRASHED = re.compile(r"Subprocess scheduler_(\d+) \(pid=(\d+)\) crashed with exit code (-?\d+)")
_SITE = re.compile(r"^.*/(?:site-packages|dist-packages)/|^.*/lib/python3\.\d+/")


def died_culprit(log_tail: Sequence[str], lost_pids: Sequence[int], held_s: float | None) -> Culprit | None:
    """A rank that died (SEGFAULT): the thread Python's faulthandler named `Current thread` in the
    server's log, and where it was. The process is gone, so its own frames come from its last words;
    SGLang's main names the rank and the exit code (`Subprocess scheduler_1 (pid=N) crashed ...`)."""
    fatal = max((i for i, line in enumerate(log_tail) if _FATAL.match(line)), default=None)
    if fatal is None:
        return None
    what = _FATAL.match(log_tail[fatal]).group(1)  # type: ignore[union-attr]
    thread, current = "?", False
    frames: list[str] = []
    for line in log_tail[fatal + 1 :]:
        m = _FH_THREAD.match(line)
        if m:
            current = m.group(1) == "Current thread"
            if current:
                thread = m.group(2)
            continue
        f = _FH_FRAME.match(line)
        if f and current and len(frames) < MAX_FRAMES:
            frames.append(f"{f.group(3)} ({_SITE.sub('', f.group(1))}:{f.group(2)})")
        elif not line.strip() and frames:
            current = False
    rank, pid, code = None, (lost_pids[0] if lost_pids else None), None
    for line in log_tail[fatal:]:
        c = _CRASHED.search(line)
        if c and (pid is None or int(c.group(2)) == pid):
            rank, pid, code = int(c.group(1)), int(c.group(2)), int(c.group(3))
    if pid is None:
        return None
    where = f"scheduler TP{rank} pid {pid}" if rank is not None else f"rank process pid {pid}"
    why = [f"the process died: Python's faulthandler logged 'Fatal Python error: {what}' with this thread current"]
    if code is not None:
        why.append(f"SGLang's main saw it exit with code {code}; the other ranks wait for it")
    return Culprit(
        rank=rank,
        pid=pid,
        process=f"{where} (exited)",
        thread=thread,
        tid=None,
        doing=f"died of a {what.lower()}",
        frames=tuple(frames),
        held_s=held_s,
        evidence=tuple(why),
    )


def lost_pids(verdict: Mapping[str, object]) -> list[int]:
    """The pids a `rank_died` verdict lost (its `lost_pid` figures)."""
    figures = verdict.get("figures")
    if not isinstance(figures, Mapping):
        return []
    v = figures.get("lost_pid")
    return [int(v)] if isinstance(v, int | float) and not isinstance(v, bool) else []


# The verdict's figure for how long the server has made no progress: at start-up no channel moved
# (`since_progress_s`), while serving no decode token came (`since_tokens_s`, a serving stall's).
HELD_FIGURES = ("since_progress_s", "since_tokens_s")


def held_from(verdict: Mapping[str, object]) -> float | None:
    """Seconds without progress, from the verdict's figures (HELD_FIGURES); None for a verdict that
    has none (a failed health check, a dead rank, RAS's or SGLang's own watchdog's finding)."""
    figures = verdict.get("figures")
    if isinstance(figures, Mapping):
        for name in HELD_FIGURES:
            v = figures.get(name)
            if isinstance(v, int | float) and not isinstance(v, bool):
                return round(float(v), 1)
    return None


NONE_NAMED = "Culprit: none named (no thread of any rank could be read: the process is gone, or no tool could read it)"
