"""The supervisor's small interface to process control, so unit tests can use a fake child.

`ProcessControl` is what the supervisor needs: spawn a server tree, stop it (verified), and kill
what an earlier daemon left behind. `RealProcessControl` delegates to `supervisor.process`, the only
module that spawns or signals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

from supervisor import process
from supervisor.cgroup import CgroupRoot, reap_orphans
from supervisor.leftovers import kill_leftovers
from supervisor.process import SpawnError, StopReport

__all__ = [
    "Child",
    "PendingLaunch",
    "ProcessControl",
    "RealProcessControl",
    "SpawnError",
    "StopReport",
    "describe_holders",
    "port_holder",
]


@dataclass(frozen=True)
class PendingLaunch:
    """A launch refused because the port was held, to be tried again at `at` (monotonic)."""

    rung: int
    after_incident: bool
    at: float


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

    @property
    def stdout(self) -> IO[bytes]: ...

    @property
    def stderr(self) -> IO[bytes]: ...

    def poll(self) -> int | None: ...


class ProcessControl(Protocol):
    def spawn(self, argv: Sequence[str], env: Mapping[str, str], marker: str, cwd: str | None) -> Child: ...

    def stop(self, root: Child | None, marker: str, host: str, port: int, grace_s: float) -> StopReport: ...

    def kill_marked(self, marker: str, host: str, port: int) -> StopReport: ...

    def reap(self, exclude: int | None) -> list[int]: ...


class RealProcessControl:
    """`cgroups`: where each launch gets its own cgroup v2 (None: not writable here); `subreaper`:
    the daemon is PR_SET_CHILD_SUBREAPER, so orphans of the tree are its children and stopped too."""

    def __init__(self, cgroups: CgroupRoot | None = None, *, subreaper: bool = False) -> None:
        self.cgroups = cgroups
        self.subreaper = subreaper

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], marker: str, cwd: str | None) -> Child:
        cgroup = None
        if self.cgroups is not None:
            try:
                cgroup = self.cgroups.create(marker)
            except OSError:
                cgroup = None  # the marker and the subreaper still find the tree
        return process.ServerProcess.spawn(argv, env, marker, cwd, cgroup=cgroup)

    def stop(self, root: Child | None, marker: str, host: str, port: int, grace_s: float) -> StopReport:
        return process.stop_tree(root, marker, host, port, grace_s, adopt_orphans=self.subreaper)

    def kill_marked(self, marker: str, host: str, port: int) -> StopReport:
        return kill_leftovers(marker, host, port, cgroups=self.cgroups)

    def reap(self, exclude: int | None) -> list[int]:
        return reap_orphans((exclude,) if exclude is not None else ()) if self.subreaper else []
