"""The supervisor's small interface to process control, so unit tests can use a fake child.

`ProcessControl` is what the supervisor needs: spawn a server tree (its output going to the log
keeper, never to a pipe the daemon holds), stop it (verified), and kill what an earlier daemon left
behind. `RealProcessControl` delegates to `supervisor.process`, the only module that spawns or
signals. `AdoptedChild` stands for a server an earlier daemon started and this one adopted.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from probes.proctree import read_stat
from supervisor import process
from supervisor.process import SpawnError, StopReport

__all__ = [
    "EXIT_UNKNOWN",
    "AdoptedChild",
    "Child",
    "LogFiles",
    "ProcessControl",
    "RealProcessControl",
    "SpawnError",
    "StopReport",
]

# The exit status of a process that is not our child cannot be read (only its parent may wait for
# it): an adopted server that ended reports this.
EXIT_UNKNOWN = 255

# What the log keeper must not inherit from the daemon: it neither notifies systemd nor serves.
_NOT_FOR_KEEPER = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID"})


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


class AdoptedChild:
    """The main process of a server tree an earlier daemon started, proven ours at adoption.

    Not our child, so it cannot be waited for: it is alive while /proc shows the same pid with the
    same start time and not a zombie. Once it is gone `poll()` stays at EXIT_UNKNOWN, so a reused
    pid is never taken for it again.
    """

    def __init__(self, pid: int, starttime: int, proc_root: str = "/proc") -> None:
        self._pid = pid
        self.starttime = starttime
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

    def stop(self, root: Child | None, marker: str, host: str, port: int, grace_s: float) -> StopReport: ...

    def kill_marked(self, marker: str, host: str, port: int) -> StopReport: ...


class RealProcessControl:
    def __init__(self, keeper_env: Mapping[str, str] | None = None) -> None:
        self._keeper_env = keeper_env
        self._keepers: list[subprocess.Popen[bytes]] = []

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], marker: str, cwd: str | None, logs: LogFiles) -> Child:
        self._reap_keepers()
        base = self._keeper_env if self._keeper_env is not None else os.environ
        keeper_env = {k: v for k, v in base.items() if k not in _NOT_FOR_KEEPER}
        keeper, write_end = process.spawn_log_keeper(str(logs.dir), logs.name, logs.max_bytes, logs.backups, keeper_env)
        self._keepers.append(keeper)
        try:
            return process.ServerProcess.spawn(argv, env, marker, cwd, output=write_end)
        finally:
            os.close(write_end)  # the server holds the only write end: the keeper ends with it

    def stop(self, root: Child | None, marker: str, host: str, port: int, grace_s: float) -> StopReport:
        report = process.stop_tree(root, marker, host, port, grace_s)
        self._reap_keepers()
        return report

    def kill_marked(self, marker: str, host: str, port: int) -> StopReport:
        return process.kill_leftovers(marker, host, port)

    def _reap_keepers(self) -> None:
        """Keepers end when their server does; reap those that did, so none stays a zombie."""
        self._keepers = [k for k in self._keepers if k.poll() is None]
