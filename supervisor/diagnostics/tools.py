"""py-spy, gdb and cuda-gdb: where they are, their command lines, and reading what they print."""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from supervisor.diagnostics.capturerecords import Frame, Outcome, StackThread, ToolName
from supervisor.diagnostics.pystack import find_pystack, pystack_ok

# gdb must never reach for the network (debuginfod) or run scripts shipped next to the target's
# libraries (auto-load): either can stall a capture that has to finish before the server is killed.
GDB_BATCH = (
    "-iex",
    "set debuginfod enabled off",
    "-iex",
    "set auto-load no",
    "-iex",
    "set print thread-events off",
    "-ex",
    "set pagination off",
    "-ex",
    "thread apply all bt",
)
CUDA_GDB_EXTRA = ("-ex", "info cuda kernels")
# Reading the symbols of every shared library (libtorch_cuda alone is hundreds of MB) is most of an
# attach to a torch process: on the H200, cuda-gdb took 8.3 s with them and 0.6 s without, and still
# listed the resident kernels (bench/real/cudagdb_probe.py). Used when py-spy --native already holds
# the host frames with their names.
NO_SHARED_SYMBOLS = ("-iex", "set auto-solib-add off")


@dataclass(frozen=True)
class ToolPaths:
    py_spy: str | None
    gdb: str | None
    gdb_kind: ToolName  # "gdb" or "cuda-gdb": what `gdb` points at
    cuda_gdb: str | None = None  # cuda-gdb, when there is one besides a plain gdb
    pystack: tuple[str, ...] | None = None  # the command that reads a stopped process (state T)

    def debugger(self, holds_gpu: bool) -> tuple[str | None, ToolName]:
        """cuda-gdb for a process that holds GPU memory (it names the kernels); plain gdb for the
        rest where there is one, else none (None, "cuda-gdb"): cuda-gdb's attach costs ~10 s per
        torch process, and the real 4-process tree spent most of its 31 s bundle in it."""
        if holds_gpu and self.cuda_gdb is not None:
            return self.cuda_gdb, "cuda-gdb"
        if self.gdb is not None and self.gdb_kind == "gdb":
            return self.gdb, "gdb"
        if self.cuda_gdb is not None:
            return None, "cuda-gdb"  # only cuda-gdb, and this process has no GPU work to show
        return None, "gdb"


def _executable(path: str) -> str | None:
    if os.sep in path:
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(path)


def find_py_spy(configured: str | None = None) -> str | None:
    """The configured path, else PATH, else next to this interpreter (a venv's bin/)."""
    if configured:
        return _executable(configured)
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def find_gdb(configured: str | None = None) -> tuple[str | None, ToolName]:
    """The configured path, else gdb on PATH, else cuda-gdb on PATH (which also names GPU kernels)."""
    if configured:
        kind: ToolName = "cuda-gdb" if Path(configured).name.startswith("cuda-gdb") else "gdb"
        return _executable(configured), kind
    gdb = shutil.which("gdb")
    if gdb:
        return gdb, "gdb"
    cuda = shutil.which("cuda-gdb")
    return (cuda, "cuda-gdb") if cuda else (None, "gdb")


def resolve(py_spy_path: str | None, gdb_path: str | None) -> ToolPaths:
    """Where the tools are; with cuda-gdb configured, a plain gdb on PATH still serves CPU-only members."""
    gdb, kind = find_gdb(gdb_path)
    cuda = gdb if kind == "cuda-gdb" else shutil.which("cuda-gdb")
    plain = shutil.which("gdb") if kind == "cuda-gdb" else None
    if plain is not None:
        gdb, kind = plain, "gdb"
    return ToolPaths(
        py_spy=find_py_spy(py_spy_path), gdb=gdb, gdb_kind=kind, cuda_gdb=cuda, pystack=find_pystack()
    )


def py_spy_argv(exe: str, pid: int, *, native: bool, nonblocking: bool) -> tuple[str, ...]:
    # Never --locals: local variables can hold tokens and request bodies.
    argv = [exe, "dump", "--pid", str(pid)]
    if native:
        argv.append("--native")
    if nonblocking:
        argv.append("--nonblocking")
    return tuple(argv)


def gdb_argv(exe: str, pid: int, kind: ToolName, *, shared_symbols: bool = True) -> tuple[str, ...]:
    extra = CUDA_GDB_EXTRA if kind == "cuda-gdb" else ()
    fast = () if shared_symbols else NO_SHARED_SYMBOLS
    return (exe, "-p", str(pid), "--batch", "-nx", *fast, *GDB_BATCH, *extra)


def tool_env(base: dict[str, str]) -> dict[str, str]:
    """The daemon's environment for the tools, minus debuginfod, in the C locale for stable messages."""
    env = {k: v for k, v in base.items() if not k.startswith("DEBUGINFOD")}
    env["LC_ALL"] = "C"
    return env


_DENIED = re.compile(r"Operation not permitted|Permission denied|os error 1\b|os error 13\b", re.I)
_GONE = re.compile(
    r"No such process|os error 3\b|Failed to get process executable name|process .* not found", re.I
)


def judge(tool: ToolName, exit_code: int | None, stdout: str, stderr: str) -> Outcome:
    """The outcome of a finished (not timed-out) run from its exit status and what it printed."""
    if tool in ("gdb", "cuda-gdb"):
        ok = bool(re.search(r"^#0\s", stdout, re.M))
    elif tool in ("pystack", "pystack-gil", "pystack-native"):
        ok = pystack_ok(exit_code, stdout)
    else:
        ok = exit_code == 0 and "Thread " in stdout
    if ok:
        return "ok"
    both = f"{stdout}\n{stderr}"
    if _DENIED.search(both):
        return "denied"
    if _GONE.search(both):
        return "gone"
    return "failed"


# py-spy text: `Thread 6876 (active+gil): "MainThread"`, then frames `    func (file.py:12)`
# or `    0x7f.. (libc.so.6)`.
_PS_THREAD = re.compile(r"^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?::\s*\"(.*)\")?\s*$")
_PS_FRAME = re.compile(r"^\s+(.+?) \(([^()]*?)(?::(\d+))?\)\s*$")


def parse_py_spy(text: str) -> tuple[StackThread, ...]:
    threads: list[StackThread] = []
    head: tuple[int | None, str, str] | None = None
    frames: list[Frame] = []
    for line in text.splitlines():
        m = _PS_THREAD.match(line)
        if m:
            if head:
                threads.append(StackThread(head[0], head[1], tuple(frames), head[2]))
            raw = m.group(1)
            tid = None if raw.startswith("0x") else int(raw)
            head, frames = (tid, m.group(3) or "", m.group(2)), []
            continue
        f = _PS_FRAME.match(line) if head else None
        if f:
            frames.append(Frame(f.group(1), f.group(2), int(f.group(3)) if f.group(3) else None))
    if head:
        threads.append(StackThread(head[0], head[1], tuple(frames), head[2]))
    return tuple(threads)


# gdb: `Thread 4 (Thread 0x7f.. (LWP 6703) "python"):` then `#2  0x.. in func (args) at file.c:139`;
# C++ frames read `#5  0x.. in c10d::ProcessGroupNCCL::allreduce(std::vector<..>&) () from libtorch_cuda.so`.
_GDB_THREAD = re.compile(r"^Thread \d+ \(.*\):\s*$")
_GDB_TID = re.compile(r"\b(?:LWP|process) (\d+)")
_GDB_NAME = re.compile(r"\"([^\"]*)\"\)?:\s*$")
_GDB_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-fA-F]+ in )?(.*?)(?: at (\S+?):(\d+)| from (\S+))?\s*$")


def parse_gdb(text: str) -> tuple[StackThread, ...]:
    threads: list[StackThread] = []
    head: tuple[int | None, str] | None = None
    frames: list[Frame] = []
    for line in text.splitlines():
        if _GDB_THREAD.match(line):
            if head:
                threads.append(StackThread(head[0], head[1], tuple(frames)))
            tid, name = _GDB_TID.search(line), _GDB_NAME.search(line)
            head, frames = (int(tid.group(1)) if tid else None, name.group(1) if name else ""), []
            continue
        f = _GDB_FRAME.match(line) if head else None
        if f:
            func = f.group(1).split("(", 1)[0].strip() or "??"
            frames.append(
                Frame(func, f.group(2) or f.group(4) or "", int(f.group(3)) if f.group(3) else None)
            )
    if head:
        threads.append(StackThread(head[0], head[1], tuple(frames)))
    return tuple(threads)


# `info cuda kernels`: `*  0  -  0  1 Active 0xff (240,1,1) (128,1,1) ncclDevKernel_AllReduce(args)`.
# A row ends `GridDim BlockDim Invocation`; the invocation is the kernel's name with its parameter
# list, and C++ names carry spaces and parentheses of their own (`at::cuda::(anonymous namespace)::x()`).
_KERNEL_ROW = re.compile(r"\(\d+,\d+,\d+\)\s+\(\d+,\d+,\d+\)\s+(\S.*?)\s*$", re.M)


def _without_params(invocation: str) -> str:
    """The name without its trailing `(...)` parameter list (balanced, so `<4096ul>` args are fine)."""
    if not invocation.endswith(")"):
        return invocation
    depth = 0
    for i in range(len(invocation) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(invocation[i], 0)
        if depth == 0:
            return invocation[:i].rstrip() or invocation
    return invocation


def parse_cuda_kernels(text: str) -> tuple[str, ...]:
    """Kernel names from cuda-gdb's `info cuda kernels` table."""
    names: list[str] = []
    for m in _KERNEL_ROW.finditer(text):
        name = _without_params(m.group(1))
        if name not in names:
            names.append(name)
    return tuple(names)
