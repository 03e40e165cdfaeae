"""One daemon per state directory: an flock on `state_dir/daemon.lock`, held for the daemon's life.

Two daemons on one state directory adopt each other's server and kill each other's launches, so a
second one refuses at once and names the holder. The lock is an `flock` on an O_CLOEXEC descriptor:
the kernel drops it when the daemon exits however it exits (SIGKILL, watchdog abort), and nothing
the daemon spawns inherits it (the server and the log keeper get only their pipes), so a server
that outlives its daemon never keeps the successor out. The file holds the holder's pid and, during
a SIGUSR2 handoff, the word `handoff`: only then does a newcomer wait (bounded) for the lock.
The handoff itself never lets go: the old image passes the locked descriptor across its `execv`
(`pass_on`, supervisor.host.inherit) and the new image checks it (`adopt`), so no other daemon can
take the state directory between the two images; a newcomer waits out its bound and is refused.

Beside the lock, `daemon.json` (`write_about`) says who holds it: pid, config path, the server's
and the API's address. Another daemon that finds a tree of this state directory on its port reads
it (supervisor.process.owners) to name this one; it is believed only while its pid holds the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from supervisor.host.inherit import PassedLock, close_fd

LOCK_NAME = "daemon.lock"
ABOUT_NAME = "daemon.json"
# A handoff's last steps (close the log capture, save state, close probes) take well under a
# second; a successor waits this long for a holder that announced a handoff, then refuses.
HANDOFF_WAIT_S = 15.0


class StateDirLocked(Exception):
    """Another daemon holds the state directory."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(
            f"another sglang-supervisor daemon ({holder}) holds {path}: one daemon per state directory; "
            "stop that one, or give this one another [paths] state_dir"
        )


class StateDirUnusable(Exception):
    """The state directory or its lock file cannot be created or opened (permissions, read-only)."""


@dataclass(frozen=True)
class Holder:
    pid: int | None
    handoff: bool

    def describe(self) -> str:
        return f"pid {self.pid}" if self.pid is not None else "pid unknown"


def parse_holder(text: str) -> Holder:
    """What the lock file says about its holder: `<pid>` or `<pid> handoff`; anything else is unknown."""
    parts = text.split()
    pid = int(parts[0]) if parts and parts[0].isdigit() and len(parts[0]) < 10 else None
    return Holder(pid, len(parts) > 1 and parts[1] == "handoff")


class StateLock:
    """The held lock; `release` (or the process ending) lets the next daemon in."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _write(self, text: str) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):  # a full disk must not stop the daemon: the flock is what counts
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, text.encode(), 0)

    def announce_handoff(self) -> None:
        """A successor started now waits for the lock instead of refusing."""
        self._write(f"{os.getpid()} handoff\n")

    def pass_on(self) -> PassedLock | None:
        """For the handoff's re-exec: the locked descriptor, kept open (`inherit.exec_env` makes it
        inheritable); this object no longer releases it. None when not held or unreadable."""
        fd = self._fd
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        self._fd = None
        return PassedLock(fd, st.st_dev, st.st_ino)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read_holder(fd: int) -> Holder:
    try:
        return parse_holder(os.pread(fd, 64, 0).decode("ascii", "replace"))
    except OSError:
        return Holder(None, False)


def acquire(
    state_dir: Path,
    *,
    handoff_wait_s: float = HANDOFF_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> StateLock:
    """Take the state directory's lock, or raise StateDirLocked naming the holder.

    Refuses at once unless the holder announced a handoff; then waits up to `handoff_wait_s`.
    """
    path = state_dir / LOCK_NAME
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    except OSError as err:
        raise StateDirUnusable(
            f"cannot use the state directory: {path}: {err.strerror or err} "
            "(check [paths] state_dir and the service user's rights)"
        ) from None
    deadline: float | None = None
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _read_holder(fd)
                now = monotonic()
                if holder.handoff and deadline is None:
                    deadline = now + handoff_wait_s
                if deadline is None or now >= deadline:
                    raise StateDirLocked(path, holder.describe()) from None
                sleep(0.05)
    except BaseException:
        os.close(fd)
        raise
    lock = StateLock(path, fd)
    lock._write(f"{os.getpid()}\n")
    return lock


def adopt(state_dir: Path, passed: PassedLock) -> StateLock | str:
    """The lock the previous image of this process passed across its exec, when the descriptor is
    still `state_dir/daemon.lock` (same device and inode as the variable said) and holds the lock
    (an flock through it succeeds at once); close-on-exec again. Else why not, the descriptor closed
    (the caller then `acquire`s as any start does)."""
    path = state_dir / LOCK_NAME
    fd = passed.fd
    try:
        mine, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError as err:
        close_fd(fd)
        return f"{path}: {err.strerror or err}"
    if not ((mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino) == (passed.dev, passed.ino)):
        close_fd(fd)
        return f"descriptor {fd} is not {path} (another file, or the file was replaced)"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        close_fd(fd)
        return f"descriptor {fd} does not hold the lock on {path} ({err.strerror or err})"
    os.set_inheritable(fd, False)
    lock = StateLock(path, fd)
    lock._write(f"{os.getpid()}\n")
    return lock


def write_about(state_dir: Path, config: Path | None, server: tuple[str, int], api: tuple[str, int]) -> None:
    """`daemon.json`: who holds the lock, for another daemon that meets this one's tree on its port.
    Best effort (atomic replace): a daemon that cannot write it is named by pid and state_dir only."""
    doc = {
        "pid": os.getpid(),
        "state_dir": str(state_dir.resolve()),
        "config": str(config.resolve()) if config is not None else None,
        "server_host": server[0],
        "server_port": server[1],
        "api_host": api[0],
        "api_port": api[1],
    }
    tmp = state_dir / f".{ABOUT_NAME}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(doc) + "\n")
        os.replace(tmp, state_dir / ABOUT_NAME)
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)
