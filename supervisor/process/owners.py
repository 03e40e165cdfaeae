"""Whose is a tree: from its marker to the state directory that launched it, and from there to
that directory's lock (supervisor.host.instance_lock), which the kernel holds exactly as long as
its daemon lives.

A marker is a hash of the state directory (`sd-<sha256[:16]>`), which cannot be turned back into a
path; so every tree also carries its state directory in `SGLANG_SUPERVISOR_STATE_DIR` (set at
spawn, inherited by every descendant), and the hash of that path must equal the marker. A tree's
owner is then one of:

- `live`: its state directory's lock is held: another daemon runs and the tree is its own. It is
  never signalled; the daemon that found it refuses to launch onto the shared port, naming it.
- `dead`: the lock is free (a probe takes and drops it at once): its daemon is gone and the tree
  is a leftover anyone on that port may stop, as before.
- `unknown`: no published state directory (a tree started by an older version, or by hand with a
  marker), one that does not hash to the marker, or a lock that cannot be read. Nothing proves
  whose it is, so nothing is done to it (the launch is refused with the tree named).

`daemon.json` beside the lock (written by the daemon once it holds the lock) says the holder's
config path and ports; it is believed only when its pid is the lock's holder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from probes.proctree import MARKER_ENV

STATE_DIR_ENV = "SGLANG_SUPERVISOR_STATE_DIR"
LOCK_NAME = "daemon.lock"  # supervisor.host.instance_lock.LOCK_NAME (a test holds them equal)
ABOUT_NAME = "daemon.json"
_MAX_ABOUT = 4096


def marker_of(state_dir: str | Path) -> str:
    """supervisor.daemon.persist.marker_for, from the process layer (a test holds them equal)."""
    return "sd-" + hashlib.sha256(os.fsencode(Path(state_dir).resolve())).hexdigest()[:16]


@dataclass(frozen=True)
class LockState:
    held: bool | None  # None: cannot tell (the lock file is missing or unreadable)
    pid: int | None
    why: str


def _proc_locks_holder(st: os.stat_result, proc_root: str) -> int | None:
    """The pid /proc/locks shows holding a FLOCK on the file `st`, if it shows one."""
    try:
        with open(f"{proc_root}/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":  # "->" marks a waiter, not a holder
            continue
        dev = fields[5].split(":")
        try:
            if (int(dev[0], 16), int(dev[1], 16), int(dev[2])) == want and int(fields[4]) > 0:
                return int(fields[4])
        except (IndexError, ValueError):
            continue
    return None


def lock_state(state_dir: str | Path, proc_root: str = "/proc") -> LockState:
    """Whether a daemon holds `state_dir`'s lock. /proc/locks answers without touching the lock;
    when it shows no holder (it hides other pid namespaces), a shared flock taken without waiting
    and dropped at once proves the lock free, and its refusal proves it held."""
    path = Path(state_dir) / LOCK_NAME
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return LockState(None, None, f"{path} does not exist")
    except OSError as err:
        return LockState(None, None, f"{path}: {err.strerror or err}")
    pid = _proc_locks_holder(st, proc_root)
    if pid is not None:
        return LockState(True, pid, f"pid {pid} holds {path}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as err:
        return LockState(None, None, f"{path}: {err.strerror or err}")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 64, 0).decode("ascii", "replace").split()
            holder = int(text[0]) if text and text[0].isdigit() and len(text[0]) < 10 else None
            return LockState(True, holder, f"{path} is locked")
        except OSError as err:
            return LockState(None, None, f"{path}: {err.strerror or err}")
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        return LockState(False, None, f"nobody holds {path}")
    finally:
        os.close(fd)


def read_about(state_dir: str | Path) -> dict[str, object]:
    """What the daemon of `state_dir` wrote about itself (pid, config, server, api); {} when
    missing or not what a daemon writes."""
    try:
        with open(Path(state_dir) / ABOUT_NAME, "rb") as f:
            doc = json.loads(f.read(_MAX_ABOUT))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass(frozen=True)
class TreeOwner:
    marker: str
    kind: Literal["live", "dead", "unknown"]
    state_dir: str | None
    pid: int | None  # the live daemon's pid, when known
    config: str | None
    why: str
    pids: tuple[int, ...] = ()  # the processes seen carrying the marker (on the port)

    def describe(self) -> str:
        if self.kind == "live":
            who = f"pid {self.pid}" if self.pid is not None else "pid unknown"
            cfg = f", config {self.config}" if self.config else ""
            return f"another sglang-supervisor daemon ({who}, state_dir {self.state_dir}{cfg})"
        shown = ", ".join(f"pid {p}" for p in self.pids) or "a tree"
        return f"{shown} with marker {self.marker} whose daemon cannot be found ({self.why})"


def owner_of(marker: str, state_dirs: Iterable[str], proc_root: str = "/proc") -> TreeOwner:
    """The owner of the tree with `marker`, whose members published `state_dirs`."""
    claimed = sorted({d for d in state_dirs if d})
    matching = [d for d in claimed if marker_of(d) == marker]
    if len(matching) != 1:
        why = (
            "it publishes no state directory (started by an older version or by hand)"
            if not claimed
            else f"its published state directory {claimed[0]!r} does not give its marker"
        )
        return TreeOwner(marker, "unknown", None, None, None, why)
    state_dir = matching[0]
    lock = lock_state(state_dir, proc_root)
    if lock.held is None:
        return TreeOwner(marker, "unknown", state_dir, None, None, lock.why)
    if not lock.held:
        return TreeOwner(marker, "dead", state_dir, None, None, lock.why)
    about = read_about(state_dir)
    config = about.get("config") if about.get("pid") == lock.pid and lock.pid is not None else None
    return TreeOwner(marker, "live", state_dir, lock.pid, config if isinstance(config, str) else None, lock.why)


def published(environ: bytes) -> tuple[str | None, str | None]:
    """The marker and the state directory in one /proc/<pid>/environ block."""
    marker = state_dir = None
    for item in environ.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key == MARKER_ENV.encode() and value:
            marker = value.decode("utf-8", "replace")
        elif key == STATE_DIR_ENV.encode() and value:
            state_dir = os.fsdecode(value)
    return marker, state_dir


def markers_of(pids: Iterable[int], proc_root: str = "/proc") -> dict[str, tuple[set[str], set[int]]]:
    """marker -> (the state directories its carriers published, the carriers) among `pids`."""
    found: dict[str, tuple[set[str], set[int]]] = {}
    for pid in pids:
        try:
            with open(f"{proc_root}/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        marker, state_dir = published(environ)
        if marker is None:
            continue
        dirs, carriers = found.setdefault(marker, (set(), set()))
        carriers.add(pid)
        if state_dir is not None:
            dirs.add(state_dir)
    return found


def foreign_owners(
    carriers: Mapping[str, tuple[set[str], set[int]]], ours: Iterable[str], proc_root: str = "/proc"
) -> list[TreeOwner]:
    """The owner of every marker in `carriers` that is not one of `ours` and does not publish a
    state directory whose marker is ours (a tree of this state directory with a marker an older
    state.json saved)."""
    mine = set(ours)
    out = []
    for marker, (dirs, pids) in sorted(carriers.items()):
        if marker in mine or any(marker_of(d) in mine for d in dirs):
            continue
        owner = owner_of(marker, dirs, proc_root)
        out.append(dataclasses.replace(owner, pids=tuple(sorted(pids))))
    return out


def live_daemons(proc_root: str = "/proc") -> list[dict[str, object]]:
    """The daemons this user can see that hold a state-directory lock: found from /proc/locks
    (FLOCK holders), their open `daemon.lock`, and its `daemon.json`; each dict has `pid`,
    `state_dir` and what `daemon.json` says (`config`, `server_host`, `server_port`, `api_port`)."""
    try:
        with open(f"{proc_root}/locks", encoding="ascii", errors="replace") as f:
            pids = {int(x.split()[4]) for x in f if len(x.split()) > 5 and x.split()[1] == "FLOCK"}
    except (OSError, ValueError):
        return []
    out: list[dict[str, object]] = []
    for pid in sorted(p for p in pids if p > 0 and p != os.getpid()):
        try:
            fds = os.listdir(f"{proc_root}/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{proc_root}/{pid}/fd/{fd}")
            except OSError:
                continue
            if not target.endswith("/" + LOCK_NAME):
                continue
            state_dir = target[: -len(LOCK_NAME) - 1]
            if lock_state(state_dir, proc_root).pid != pid:
                continue
            about = read_about(state_dir)
            if about.get("pid") != pid:
                about = {}
            out.append({**about, "pid": pid, "state_dir": state_dir})
            break
    return out
