"""A fake server process and process control for the owner's unit tests: no processes, no signals.

`FakeControl` answers the `supervisor.process.control.ProcessControl` protocol: spawns are recorded
(argv, env), stops end the fake child, nothing is left over. The real processes are in
tests/integration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from supervisor.logs.tending import KeeperStatus
from supervisor.process.control import LogFiles, SpawnError, StopReport

NO_SUCH_PID = 4_000_000  # above pid_max: the evidence tools find nothing to attach to


class FakeChild:
    def __init__(self, pid: int) -> None:
        self._pid = pid
        self.code: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    def poll(self) -> int | None:
        return self.code

    def exit(self, code: int) -> None:
        if self.code is None:
            self.code = code


class FakeControl:
    def __init__(self) -> None:
        self.spawned: list[tuple[tuple[str, ...], dict[str, str]]] = []
        self.children: list[FakeChild] = []
        self.stops = 0
        self.swept: list[tuple[str, ...]] = []  # the markers each leftovers sweep was given
        self.fail_spawn = False

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], marker: str, cwd: str | None, logs: LogFiles
    ) -> FakeChild:
        if self.fail_spawn:
            raise SpawnError(f"cannot run {argv[0]!r}: no such file")
        self.spawned.append((tuple(argv), dict(env)))
        child = FakeChild(NO_SUCH_PID + len(self.children))
        self.children.append(child)
        return child

    def stop(self, root: object, marker: str, host: str, port: int, grace_s: float) -> StopReport:
        self.stops += 1
        pid = root.pid if isinstance(root, FakeChild) else 0
        if isinstance(root, FakeChild):
            root.exit(-15)
        return StopReport((pid,), (pid,), (), (), True, (), -15, 0.01, False)

    def adopt(self, pid: int, starttime: int, marker: str) -> FakeChild:
        return FakeChild(pid)

    def reap(self, exclude: int | None) -> list[int]:
        return []

    def kill_leftovers(self, markers: tuple[str, ...], host: str, port: int) -> StopReport:
        self.swept.append(markers)
        return StopReport((), (), (), (), True, (), None, 0.0, False)

    def tend_keeper(self, server_pid: int, logs: LogFiles) -> KeeperStatus:
        return KeeperStatus("running", 4242)

    def exit_all(self) -> None:
        for c in self.children:
            c.exit(0)
