"""Tending the log keeper: notice it dead or stopped, and put a new one on the same pipe.

The server's output pipe outlives any one keeper as long as something holds a read end. The daemon
holds one of its own (never read, O_CLOEXEC): taken at the launch, or, after a daemon restart, by
opening the server's `/proc/<pid>/fd/1` (a pipe opened through /proc is the same pipe, and the
kernel allows it to the server's own user). So a keeper killed with `kill -9` (daemon up or down)
costs no line: the pipe keeps its unread bytes (up to its 1 MiB), and the daemon starts a new keeper
on a duplicate of its read end at the next poll. A keeper that is stopped (SIGSTOP, a debugger) does
not read: the daemon names it, and when the pipe is full the server blocks on its output; the
incident says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import termios
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from probes.proctree import read_stat

_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
KEEPER_MODULE = b"supervisor.logs.keeper"

KeeperCondition = Literal["running", "stopped", "replaced", "lost", "none"]


@dataclass(frozen=True)
class KeeperStatus:
    """One poll's look at the keeper of the server's output."""

    condition: KeeperCondition  # replaced: it was gone and a new one runs; lost: gone, no way to replace it
    pid: int | None  # the keeper now (after a replacement, the new one)
    old_pid: int | None = None  # the one that was gone (replaced, lost)
    why: str = ""  # how the old one ended, or why it could not be replaced
    pipe_bytes: int | None = None  # unread bytes in the server's output pipe
    pipe_size: int | None = None

    @property
    def pipe_full(self) -> bool:
        # The kernel fills a pipe in page-sized slots, so writers block well before every byte of
        # its capacity holds data (measured: 915,063 of 1,048,576 unread bytes with the writer blocked).
        return self.pipe_bytes is not None and self.pipe_size is not None and self.pipe_bytes * 4 >= self.pipe_size * 3

    def describe(self) -> str:
        """For an incident's reason: the keeper as the cause of a server blocked on its output."""
        if self.condition != "stopped" or self.pid is None:
            return ""
        fill = f"{self.pipe_bytes} of {self.pipe_size} bytes" if self.pipe_bytes is not None else "unknown fill"
        blocked = f"full ({fill}): the server blocks writing its output" if self.pipe_full else f"holding {fill}"
        return f"the log keeper (pid {self.pid}) is stopped (SIGSTOP?) and does not read; the output pipe is {blocked}"


def _pipe_inode(path: str) -> str | None:
    try:
        target = os.readlink(path)
    except OSError:
        return None
    return target if target.startswith("pipe:[") else None


def open_read_end(server_pid: int, proc_root: str = "/proc") -> int | None:
    """A read end of the server's output pipe, through /proc; None when fd 1 is not a pipe or unreachable."""
    path = f"{proc_root}/{server_pid}/fd/1"
    if _pipe_inode(path) is None:
        return None
    try:
        # O_NONBLOCK: a pipe opened through /proc waits for a writer like a FIFO; cleared at once,
        # because the flag belongs to the open file the new keeper will read from.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    return fd


def find_keeper(read_fd: int, proc_root: str = "/proc") -> tuple[int, int] | None:
    """(pid, start time) of the log keeper reading the pipe `read_fd` belongs to, or None."""
    pipe = _pipe_inode(f"/proc/self/fd/{read_fd}")
    if pipe is None:
        return None
    try:
        pids = [int(n) for n in os.listdir(proc_root) if n.isdigit()]
    except OSError:
        return None
    for pid in pids:
        if _pipe_inode(f"{proc_root}/{pid}/fd/0") != pipe:
            continue
        try:
            with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        st = read_stat(pid, proc_root)
        if KEEPER_MODULE in argv and st is not None and pid != os.getpid():
            return pid, st.starttime
    return None


def pipe_fill(read_fd: int) -> tuple[int | None, int | None]:
    """(unread bytes, capacity) of the pipe `read_fd` belongs to."""
    size: int | None = None
    with contextlib.suppress(OSError):
        size = fcntl.fcntl(read_fd, _F_GETPIPE_SZ)
    unread: int | None = None
    with contextlib.suppress(OSError):
        buf = fcntl.ioctl(read_fd, termios.FIONREAD, b"\0\0\0\0")
        unread = int.from_bytes(buf, "little")
    return unread, size


@dataclass
class Keeper:
    """The keeper of one server's output, and the daemon's own read end of its pipe."""

    server_pid: int
    read_fd: int | None
    pid: int | None
    starttime: int | None
    popen: subprocess.Popen[bytes] | None = None  # when this daemon started it (so it can be reaped)

    def close(self) -> None:
        fd, self.read_fd = self.read_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def gone(self, proc_root: str = "/proc") -> str | None:
        """How the keeper ended ("exited 0", "killed by signal 9", "gone"), or None while it lives."""
        if self.pid is None:
            return "none"
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:
                return None
            return f"killed by signal {-code}" if code < 0 else f"exited {code}"
        st = read_stat(self.pid, proc_root)
        if st is None or st.starttime != self.starttime or st.state == "Z":
            return "gone"
        return None

    def stopped(self, proc_root: str = "/proc") -> bool:
        st = read_stat(self.pid, proc_root) if self.pid is not None else None
        return st is not None and st.state in ("T", "t")


def tend(
    keeper: Keeper,
    server_alive: Callable[[], bool],
    respawn: Callable[[int], subprocess.Popen[bytes]],
    proc_root: str = "/proc",
) -> KeeperStatus:
    """Look at the keeper; if it is gone while the server lives, start a new one on the same pipe."""
    unread, size = pipe_fill(keeper.read_fd) if keeper.read_fd is not None else (None, None)
    ended = keeper.gone(proc_root)
    if ended is None:
        cond: KeeperCondition = "stopped" if keeper.stopped(proc_root) else "running"
        return KeeperStatus(cond, keeper.pid, pipe_bytes=unread, pipe_size=size)
    if not server_alive():
        return KeeperStatus("none", None)
    old = keeper.pid
    if keeper.read_fd is None:
        return KeeperStatus("lost", None, old, f"{ended}; no read end of the server's output pipe to hand on")
    new = respawn(keeper.read_fd)
    st = read_stat(new.pid, proc_root)
    keeper.pid, keeper.popen = new.pid, new
    keeper.starttime = st.starttime if st is not None else None
    return KeeperStatus("replaced", new.pid, old, ended, unread, size)
