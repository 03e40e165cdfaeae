"""No survivor: a cgroup v2 per launch where the daemon may create one, and the child subreaper.

A descendant that leaves the server's session and clears its environment is found by neither the
process group nor the marker. Two kernel features still hold it:
- **cgroup v2**: each launch runs in its own cgroup below the daemon's (systemd's `Delegate=yes`
  hands the daemon its subtree; a root daemon on a plain cgroup2 mount can write there too). No
  process can leave it without privileges, and `cgroup.kill` kills all of it at once.
- **PR_SET_CHILD_SUBREAPER**: an orphan of the tree is re-parented to the daemon instead of init,
  so it is still the daemon's descendant, found and reaped.
Where the cgroup is not writable, `CgroupRoot.find` answers None with the reason, and the marker
and the subreaper remain.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from probes.proctree import ProcStat, read_stat
from supervisor.process.preexec import libc_prctl

PR_SET_CHILD_SUBREAPER = 36
PREFIX = "sglang-server-"


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where prctl refuses."""
    prctl = libc_prctl()
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _cgroup2_mount(mountinfo: str) -> Path | None:
    try:
        text = Path(mountinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4])
    return None


def _own_cgroup(proc_cgroup: str) -> str | None:
    try:
        text = Path(proc_cgroup).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


@dataclass(frozen=True)
class CgroupRoot:
    """The directory under which the daemon creates one cgroup per launch."""

    path: Path

    @classmethod
    def find(
        cls, *, mountinfo: str = "/proc/self/mountinfo", proc_cgroup: str = "/proc/self/cgroup"
    ) -> tuple[CgroupRoot | None, str]:
        """The daemon's own cgroup v2 directory if it may create children there, or None and why."""
        mount = _cgroup2_mount(mountinfo)
        if mount is None:
            return None, "no cgroup2 mount"
        own = _own_cgroup(proc_cgroup)
        if own is None:
            return None, "no cgroup v2 membership in /proc/self/cgroup"
        path = mount / own.lstrip("/")
        root = cls(path)
        why = root.check()
        return (root, f"cgroup v2 at {path}") if not why else (None, why)

    def check(self) -> str:
        """Empty when a child cgroup can be made, killed and removed here; else why not."""
        if not (self.path / "cgroup.procs").exists():
            return f"{self.path} is not a cgroup v2 directory"
        probe = self.path / f"{PREFIX}probe-{os.getpid()}"
        try:
            probe.mkdir()
        except OSError as err:
            return f"cannot create a cgroup in {self.path}: {err.strerror or err} (run as root or with Delegate=yes)"
        try:
            if not (probe / "cgroup.kill").exists():
                return "the kernel has no cgroup.kill (Linux 5.14 or later)"
            return ""
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()

    def create(self, name: str) -> LaunchCgroup:
        """A fresh cgroup for one launch (an old one of the same name is killed and removed first)."""
        cg = LaunchCgroup(self.path / f"{PREFIX}{name}")
        if cg.path.exists():
            cg.kill_and_remove()
        cg.path.mkdir()
        return cg

    def leftovers_of(self, marker: str) -> list[LaunchCgroup]:
        """The launch cgroup an earlier daemon with this marker left here (its server may still run
        in it); other daemons' cgroups are not ours to touch."""
        path = self.path / f"{PREFIX}{marker}"
        return [LaunchCgroup(path)] if path.is_dir() else []


@dataclass(frozen=True)
class LaunchCgroup:
    path: Path

    def procs(self) -> tuple[int, ...]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return ()
        return tuple(sorted(int(x) for x in text.split() if x.isdigit()))

    def attach_fd(self) -> int:
        """An open descriptor on cgroup.procs: writing "0" to it from the forked child moves the child
        in before exec, so nothing the server starts runs outside."""
        return os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

    def kill(self) -> bool:
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:
            return False
        return True

    def kill_and_remove(
        self, timeout_s: float = 10.0, *, sleep: Callable[[float], None] = time.sleep
    ) -> tuple[tuple[int, ...], bool]:
        """SIGKILL everything left in it, wait (bounded) until empty, remove it; (pids killed, removed)."""
        pids = self.procs()
        if pids:
            self.kill()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                return pids, True
            except FileNotFoundError:
                return pids, True
            except OSError as err:
                if err.errno != errno.EBUSY or time.monotonic() >= deadline:
                    return pids, False
            sleep(0.05)


def adopted_orphans(proc_root: str = "/proc") -> list[ProcStat]:
    """Children of this process in a session other than its own, the server's root excepted by the
    caller. With PR_SET_CHILD_SUBREAPER set these are orphans of the server tree: everything the
    daemon starts itself runs in its own session, except the server, which is seeded separately."""
    me = os.getpid()
    own = read_stat(me, proc_root)
    if own is None:
        return []
    found = []
    for pid in _children_of(me, proc_root):
        st = read_stat(pid, proc_root)
        if st is not None and st.ppid == me and st.sid != own.sid:
            found.append(st)
    return found


def _children_of(pid: int, proc_root: str) -> list[int]:
    """From /proc/<pid>/task/*/children (Linux 3.5+, CONFIG_PROC_CHILDREN), else a scan of /proc."""
    kids: set[int] = set()
    try:
        for tid in os.listdir(f"{proc_root}/{pid}/task"):
            with open(f"{proc_root}/{pid}/task/{tid}/children") as f:
                kids.update(int(x) for x in f.read().split())
        return sorted(kids)
    except (OSError, ValueError):
        pass
    out = []
    for name in os.listdir(proc_root):
        if name.isdigit() and (st := read_stat(int(name), proc_root)) is not None and st.ppid == pid:
            out.append(st.pid)
    return out


def reap_orphans(exclude: Iterable[int] = (), proc_root: str = "/proc") -> list[int]:
    """waitpid the adopted orphans that have exited (zombies), never `exclude` (the server's root,
    which its Popen reaps); returns the pids reaped."""
    skip = set(exclude)
    reaped = []
    for st in adopted_orphans(proc_root):
        if st.pid in skip or not st.zombie:
            continue
        try:
            pid, _ = os.waitpid(st.pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if pid:
            reaped.append(pid)
    return reaped
