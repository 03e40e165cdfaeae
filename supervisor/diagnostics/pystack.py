"""pystack: the reader for a process that py-spy cannot read.

py-spy needs the process to run (it pauses it briefly, reads, resumes); a process in state T
(SIGSTOPped, or held by someone else's debugger) never answers, and py-spy's attempt costs the
capture its whole timeout. pystack reads the same memory through ptrace and /proc/PID/mem and works
on a stopped process, leaving it stopped (measured 0.11 s, 0.17 s with native frames).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path

from supervisor.diagnostics.capturerecords import Frame, StackThread


def find_pystack() -> tuple[str, ...] | None:
    """The command that runs pystack: on PATH, else next to this interpreter (a venv's bin/), else
    `python -m pystack` where the module is importable (a wheel unpacked onto PYTHONPATH has no
    script); None where it is not installed."""
    found = shutil.which("pystack")
    if found:
        return (found,)
    beside = Path(sys.executable).parent / "pystack"
    if beside.is_file() and os.access(beside, os.X_OK):
        return (str(beside),)
    try:
        spec = importlib.util.find_spec("pystack")
    except (ImportError, ValueError):
        spec = None
    return (sys.executable, "-m", "pystack") if spec is not None else None


def pystack_argv(
    cmd: tuple[str, ...], pid: int, *, native: bool, nonblocking: bool = False, every_thread: bool = False
) -> tuple[str, ...]:
    """`every_thread`: native frames of the threads with no Python state too (NCCL's, CUDA's)."""
    # Never --locals: local variables can hold tokens and request bodies.
    argv = [*cmd, "remote", str(pid), "--no-color"]
    if nonblocking:  # a healthy server a person only asked about is not paused (no native frames then)
        argv.append("--no-block")
    elif every_thread:
        argv.append("--native-all")
    elif native:
        argv.append("--native")
    return tuple(argv)


def pystack_ok(exit_code: int | None, stdout: str) -> bool:
    return exit_code == 0 and "Traceback for thread" in stdout


# `Traceback for thread 11850 (python3) [] (most recent call last):`, then frames
# `    (Python) File "/tmp/x.py", line 3, in f` (followed by the source line, indented more) or
# `    (C) File "./Modules/timemodule.c", line 383, in time_sleep (/usr/lib/libpython3.11.so.1.0)`.
_THREAD = re.compile(r"^Traceback for thread (\d+) \(([^)]*)\)(?: \[([^\]]*)\])?")
_FRAME = re.compile(r'^\s+\((Python|C)\) File "([^"]*)", line (\d+), in (\S+)(?: \(inlined\))?(?: \(([^()]*)\))?\s*$')


_SHORT = re.compile(r"^.*/(?:site-packages|dist-packages)/|^.*/lib/python3\.\d+/")


def _short(path: str) -> str:
    """The path as py-spy prints it: from the package root (`torch/distributed/x.py`) where the file
    is installed, else its base name."""
    short = _SHORT.sub("", path)
    return short if short != path else os.path.basename(path)


def parse_pystack(text: str) -> tuple[StackThread, ...]:
    """Threads with frames innermost first (pystack prints the outermost first). Python frames
    carry the file's base name and line, as py-spy's do; native frames the library they are in."""
    threads: list[StackThread] = []
    head: tuple[int, str, str] | None = None
    frames: list[Frame] = []

    def close() -> None:
        if head is not None:
            threads.append(StackThread(head[0], head[1], tuple(reversed(frames)), head[2]))

    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            close()
            head, frames = (int(m.group(1)), m.group(2), (m.group(3) or "").strip()), []
            continue
        f = _FRAME.match(line) if head else None
        if f is None:
            continue
        kind, path, lineno, func, lib = f.groups()
        if kind == "Python":
            frames.append(Frame(func, _short(path), int(lineno)))
        else:
            frames.append(Frame(func, os.path.basename(lib) if lib else os.path.basename(path), None))
    close()
    return tuple(threads)
