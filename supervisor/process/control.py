"""The supervisor's small interface to process control, so unit tests can use a fake child.

`ProcessControl` is what the supervisor needs: spawn a server tree (its output going to the log
keeper, never to a pipe the daemon holds), stop it (verified), kill what an earlier daemon left
behind, and adopt a tree an earlier daemon started. `RealProcessControl` delegates to
`supervisor.process`, the only module that spawns or signals. `AdoptedChild` stands for a server an
earlier daemon started and this one adopted.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from probes.proctree import read_stat
from supervisor import process
from supervisor.logs.tending import Keeper, KeeperStatus, find_keeper, open_read_end, tend
from supervisor.process import SpawnError, StopReport
from supervisor.process.cgroup import CgroupRoot, LaunchCgroup, reap_orphans
from supervisor.process.leftovers import kill_leftovers

__all__ = [
    "EXIT_UNKNOWN",
    "AdoptedChild",
    "Child",
    "LogFiles",
    "ProcessControl",
    "RealProcessControl",
    "SpawnError",
    "StopReport",
    "describe_holders",
    "port_holder",
]

# The exit status of a process that is not our child cannot be read (only its parent may wait for
# it): an adopted server that ended reports this.
EXIT_UNKNOWN = 255

# All the log keeper gets of the daemon's environment: what Python needs to start. No secrets (the
# API token, HF_TOKEN), no systemd variables (NOTIFY_SOCKET): it only copies bytes to a file.
_FOR_KEEPER = ("PATH", "PYTHONPATH", "PYTHONHOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
KEEPER_DRAIN_S = 2.0  # a keeper ends once the stopped server's last output is written
# The directory holding the `supervisor` package: the keeper runs from "/" and must still import it.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def keeper_env(base: Mapping[str, str]) -> dict[str, str]:
    env = {k: base[k] for k in _FOR_KEEPER if k in base}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def port_holder(host: str, port: int) -> str | None:
    """Who holds the server port, in words (pids and names), or None when it is free."""
    if process.port_is_free(host, port):
        return None
    return describe_holders(process.port_holders(port) or ())


def describe_holders(pids: Sequence[int]) -> str:
    """`pid 123 (python3), pid 456 (sglang::sched)`; a listener the daemon cannot see said so."""
    if not pids:
        return "a socket whose owner is not visible to the daemon"
    named = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                named.append(f"pid {pid} ({f.read().strip()})")
        except OSError:
            named.append(f"pid {pid}")
    return ", ".join(named)


class Child(Protocol):
    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...


@dataclass(frozen=True)
class LogFiles:
    """Where the log keeper writes the server's output, and how much of it is kept."""

    dir: Path
    max_bytes: int
    backups: int
    name: str = "server.log"
    journal_socket: str | None = None  # also copy each line to journald ([logs] journal)
    journal_id: str = "sglang"

    def keeper_args(self) -> tuple[str, ...]:
        if self.journal_socket is None:
            return ()
        return ("--journal-socket", self.journal_socket, "--journal-id", self.journal_id)


class AdoptedChild:
    """The main process of a server tree an earlier daemon started, proven ours at adoption.

    Not our child, so it cannot be waited for: it is alive while /proc shows the same pid with the
    same start time and not a zombie. Once it is gone `poll()` stays at EXIT_UNKNOWN, so a reused
    pid is never taken for it again.
    """

    def __init__(self, pid: int, starttime: int, cgroup: LaunchCgroup | None = None, proc_root: str = "/proc") -> None:
        self._pid = pid
        self.starttime = starttime
        self.cgroup = cgroup  # its launch cgroup, when the predecessor made one: the stop uses it
        self._proc_root = proc_root
        self._code: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    def poll(self) -> int | None:
        if self._code is None:
            st = read_stat(self._pid, self._proc_root)
            if st is None or st.starttime != self.starttime or st.zombie:
                self._code = EXIT_UNKNOWN
        return self._code


class ProcessControl(Protocol):
    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], marker: str, cwd: str | None, logs: LogFiles
    ) -> Child: ...

    def adopt(self, pid: int, starttime: int, marker: str) -> Child: ...

    def stop(self, root: Child | None, marker: str, host: str, port: int, grace_s: float) -> StopReport: ...

    def kill_leftovers(self, markers: tuple[str, ...], host: str, port: int) -> StopReport: ...

    def reap(self, exclude: int | None) -> list[int]: ...

    def tend_keeper(self, server_pid: int, logs: LogFiles) -> KeeperStatus: ...


class RealProcessControl:
    """`cgroups`: where each launch gets its own cgroup v2 (None: not writable here); `subreaper`:
    the daemon is PR_SET_CHILD_SUBREAPER, so orphans of the tree are its children and stopped too;
    `keeper_env`: the log keeper's environment (default: the daemon's)."""

    def __init__(
        self,
        cgroups: CgroupRoot | None = None,
        *,
        subreaper: bool = False,
        keeper_env: Mapping[str, str] | None = None,
    ) -> None:
        self.cgroups = cgroups
        self.subreaper = subreaper
        self._keeper_env = keeper_env
        self._keepers: list[subprocess.Popen[bytes]] = []
        # Every server this daemon spawned, until its Popen has seen it end (see `_collect`).
        self._servers: list[Child] = []
        self.keeper: Keeper | None = None  # the keeper of the running server's output

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], marker: str, cwd: str | None, logs: LogFiles) -> Child:
        self._reap_keepers()
        cgroup = None
        if self.cgroups is not None:
            try:
                cgroup = self.cgroups.create(marker)
            except OSError:
                cgroup = None  # the marker and the subreaper still find the tree
        env_k = self._env_for_keeper()
        keeper, write_end, kept = process.spawn_log_keeper(
            str(logs.dir), logs.name, logs.max_bytes, logs.backups, env_k, logs.keeper_args()
        )
        self._keepers.append(keeper)
        try:
            server = process.ServerProcess.spawn(argv, env, marker, cwd, output=write_end, cgroup=cgroup)
        except BaseException:
            os.close(kept)
            if cgroup is not None:  # a launch that never ran leaves no empty cgroup behind
                cgroup.kill_and_remove(1.0)
            raise
        finally:
            os.close(write_end)  # the server holds the only write end: the keeper ends with it
        self._set_keeper(Keeper(server.pid, kept, keeper.pid, _starttime(keeper.pid), keeper))
        self._servers.append(server)
        return server

    def _env_for_keeper(self) -> dict[str, str]:
        return keeper_env(self._keeper_env if self._keeper_env is not None else os.environ)

    def _set_keeper(self, keeper: Keeper | None) -> None:
        if self.keeper is not None:
            self.keeper.close()
        self.keeper = keeper

    def tend_keeper(self, server_pid: int, logs: LogFiles) -> KeeperStatus:
        """The server's log keeper: alive, stopped, or replaced by a new one on the same pipe."""
        k = self.keeper
        if k is None or k.server_pid != server_pid:
            return KeeperStatus("none", None)

        def respawn(read_fd: int) -> subprocess.Popen[bytes]:
            new = process.start_log_keeper(
                read_fd,
                str(logs.dir),
                logs.name,
                logs.max_bytes,
                logs.backups,
                self._env_for_keeper(),
                logs.keeper_args(),
            )
            self._keepers.append(new)
            return new

        def server_alive() -> bool:
            return read_stat(server_pid) is not None

        self._reap_keepers()
        try:
            return tend(k, server_alive, respawn)
        except SpawnError as err:
            return KeeperStatus("lost", None, k.pid, str(err))

    def adopt(self, pid: int, starttime: int, marker: str) -> Child:
        """The predecessor's server (proven ours by the caller), with its launch cgroup if it is in one."""
        found = self.cgroups.leftovers_of(marker) if self.cgroups is not None else []
        cgroup = next((cg for cg in found if pid in cg.procs()), None)
        read_fd = open_read_end(pid)  # the keeper is not our child: the pipe is reached through /proc
        found_keeper = find_keeper(read_fd) if read_fd is not None else None
        kpid, kstart = found_keeper if found_keeper is not None else (None, None)
        self._set_keeper(Keeper(pid, read_fd, kpid, kstart))
        return AdoptedChild(pid, starttime, cgroup)

    def stop(self, root: Child | None, marker: str, host: str, port: int, grace_s: float) -> StopReport:
        report = process.stop_tree(root, marker, host, port, grace_s, adopt_orphans=self.subreaper)
        self._set_keeper(None)  # the daemon's read end goes with the server
        self._reap_keepers(wait_s=KEEPER_DRAIN_S)
        self._collect()
        return report

    def kill_leftovers(self, markers: tuple[str, ...], host: str, port: int) -> StopReport:
        return kill_leftovers(markers, host, port, cgroups=self.cgroups)

    def reap(self, exclude: int | None) -> list[int]:
        # Keepers are left to their Popen, which then knows how they ended (a signal, an exit code).
        self._collect()
        skip = (
            *((exclude,) if exclude is not None else ()),
            *(k.pid for k in self._keepers),
            *(c.pid for c in self._servers),
        )
        return reap_orphans(skip) if self.subreaper else []

    def _collect(self) -> None:
        """Servers this daemon spawned are reaped by their own Popen (which then knows their exit),
        never by the orphan sweep: a Popen whose child someone else reaped would never learn it ended."""
        self._servers = [c for c in self._servers if c.poll() is None]

    def _reap_keepers(self, wait_s: float = 0.0) -> None:
        """Keepers end when their server does; reap those that did, so none stays a zombie.

        After a stop the keeper is still writing the server's last bytes when the tree is gone:
        `wait_s` gives it that long to finish, so a daemon that exits next leaves no keeper unreaped.
        """
        until = time.monotonic() + wait_s
        for k in self._keepers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                k.wait(max(0.0, until - time.monotonic()))
        self._keepers = [k for k in self._keepers if k.poll() is None]


def _starttime(pid: int) -> int | None:
    st = read_stat(pid)
    return st.starttime if st is not None else None
