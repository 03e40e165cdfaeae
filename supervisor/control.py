"""The supervisor's small interface to process control, so unit tests can use a fake child.

`ProcessControl` is what the supervisor needs: spawn a server tree, stop it (verified), and kill
what an earlier daemon left behind. `RealProcessControl` delegates to `supervisor.process`, the only
module that spawns or signals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import IO, Protocol

from supervisor import process
from supervisor.process import SpawnError, StopReport

__all__ = ["Child", "ProcessControl", "RealProcessControl", "SpawnError", "StopReport"]


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


class RealProcessControl:
    def spawn(self, argv: Sequence[str], env: Mapping[str, str], marker: str, cwd: str | None) -> Child:
        return process.ServerProcess.spawn(argv, env, marker, cwd)

    def stop(self, root: Child | None, marker: str, host: str, port: int, grace_s: float) -> StopReport:
        return process.stop_tree(root, marker, host, port, grace_s)

    def kill_marked(self, marker: str, host: str, port: int) -> StopReport:
        return process.kill_leftovers(marker, host, port)
