"""One launch of the server: what uvicorn's `Process` is to its supervisor.

A `Server` is made for each launch (`spawn`) or adoption (`adopt`) and holds what belongs to that
one tree: its main process, the record a successor adopts it by, its log keeper and captured output,
and what the watchdog has seen of it. It spawns or adopts, feeds the observer its new log lines,
tends its log keeper, stops and verifies, and hands over; the owner (`supervisor.daemon.owner.Owner`)
holds the current one, asks it, and records what it reports. It never records, moves a state or
touches the ladder: each act returns its outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from probes.types import LogLine, Observation
from supervisor.clock import Clock
from supervisor.daemon import stopping
from supervisor.daemon.adopt import ServerRecord, refusal, starttime_of
from supervisor.daemon.observe import Target
from supervisor.daemon.stopping import StopTools
from supervisor.logs.reader import LogCapture
from supervisor.logs.tending import KeeperStatus
from supervisor.policy.watchdog import History, new_history
from supervisor.process.control import Child, LogFiles, ProcessControl, SpawnError, port_holder
from supervisor.process.leftovers import kept_on_port

# ---- launching: is the port free, then spawn the rung's command with its output captured ----

@dataclass(frozen=True)
class Spawned:
    """The server runs: its process, its captured output, and the record a successor adopts it by
    (None when its start time could not be read: it then cannot be adopted)."""

    child: Child
    capture: LogCapture
    record: ServerRecord | None


@dataclass(frozen=True)
class SpawnFailed:
    """The command could not be executed at all (missing program, permission denied)."""

    error: str


async def port_holder_of(host: str, port: int) -> str | None:
    """Who holds the server's port (a launch onto it would only exit at once), or None when free;
    a tree another live daemon (or no findable daemon) launched there is named as such."""
    return await asyncio.to_thread(_port_holder_named, host, port)


def _port_holder_named(host: str, port: int) -> str | None:
    holder = port_holder(host, port)
    if holder is None:
        return None
    kept = kept_on_port(port)
    return holder if kept is None else f"{holder}: {kept}; it is not this daemon's to stop"


@dataclass(frozen=True)
class SpawnRequest:
    argv: Sequence[str]
    env: Mapping[str, str]
    marker: str
    cwd: str | None
    files: LogFiles
    memory_lines: int
    rung: str
    launched_wall: float


async def spawn_tree(control: ProcessControl, req: SpawnRequest, clock: Clock) -> Spawned | SpawnFailed:
    """Spawn the rung's command; its lines are captured from the log's current end (the keeper
    appends after it), so a new launch never shows the previous server's lines."""
    files = req.files
    capture = LogCapture(
        files.dir,
        memory_lines=req.memory_lines,
        start=LogCapture.end_of(files.dir, files.name),
        monotonic=clock.monotonic,
    )
    try:
        child = await asyncio.to_thread(control.spawn, req.argv, req.env, req.marker, req.cwd, files)
    except SpawnError as err:
        return SpawnFailed(str(err))
    capture.start()
    starttime = starttime_of(child.pid)
    record = (
        None if starttime is None else ServerRecord(child.pid, starttime, req.rung, req.launched_wall, capture.position)
    )
    return Spawned(child, capture, record)


# ---- adoption: a predecessor's tree, when supervisor.daemon.adopt.refusal proves it that server ----

@dataclass(frozen=True)
class Adopted:
    child: Child
    capture: LogCapture


@dataclass(frozen=True)
class NotAdopted:
    why: str


async def take_over(
    record: ServerRecord,
    rung: int | None,
    marker: str,
    control: ProcessControl,
    files: LogFiles,
    memory_lines: int,
    clock: Clock,
) -> Adopted | NotAdopted:
    """`rung`: the record's rung in today's ladder (None: no longer there, so not adopted)."""
    why = await asyncio.to_thread(refusal, record, marker)
    if why is None and rung is None:
        why = f"its rung {record.rung!r} is no longer in the ladder"
    if why is not None:
        return NotAdopted(why)
    # Its output is read from where the predecessor stopped reading (duplicates, never losses).
    capture = LogCapture(files.dir, memory_lines=memory_lines, start=record.log, monotonic=clock.monotonic).start()
    child = await asyncio.to_thread(control.adopt, record.pid, record.starttime, marker)
    return Adopted(child, capture)


@dataclass
class Server:
    """The current server: its process, what a successor needs to adopt it, its output, and what
    the watchdog has seen of it. A launch or an adoption makes a fresh one; a stop empties it (what
    it showed stays for /status until the next one)."""

    launched_at: float
    launched_wall: float | None = None
    child: Child | None = None
    record: ServerRecord | None = None  # what a successor needs to adopt `child`
    capture: LogCapture | None = None
    keeper: KeeperStatus | None = None  # the log keeper at the last poll (supervisor.logs.tending)
    log_seq: int = 0
    history: History | None = None
    obs: Observation | None = None
    ready_at: float | None = None
    time_to_ready_s: float | None = None
    adopted: bool = False  # taken over from an earlier daemon
    takeover_s: float | None = None  # adoption to ready, for an adopted server
    stable_marked: bool = False
    spec_alerted: bool = False

    @classmethod
    def fresh(cls, now: float, launched_wall: float) -> Server:
        """A new server (launched or adopted): nothing the previous one showed carries over."""
        return cls(launched_at=now, launched_wall=launched_wall, history=new_history(now))

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child is not None else None

    # ---- spawn or adopt ---------------------------------------------------------------------

    async def spawn(
        self, control: ProcessControl, request: SpawnRequest, clock: Clock
    ) -> SpawnFailed | None:
        """Start the tree; None once it runs (its record saved from here on lets a successor adopt it)."""
        spawned = await spawn_tree(control, request, clock)
        if isinstance(spawned, SpawnFailed):
            return spawned
        self.child, self.capture, self.record = spawned.child, spawned.capture, spawned.record
        return None

    def adopt(self, taken: Adopted, record: ServerRecord) -> None:
        """Hold a predecessor's tree (`takeover.take_over` proved it ours)."""
        self.adopted = True
        self.capture, self.child, self.record = taken.capture, taken.child, record

    # ---- observe ----------------------------------------------------------------------------

    def new_lines(self) -> list[LogLine]:
        """The log lines captured since the last call."""
        if self.capture is None:
            return []
        lines = self.capture.lines_since(self.log_seq)
        if lines:
            self.log_seq = lines[-1].seq
        return lines

    def target(self, *, marker: str, serving: bool, metrics: bool, look: bool) -> Target:
        child = self.child
        return Target(
            root_pid=child.pid if child is not None else None,
            root_exit=child.poll() if child is not None else None,
            marker=marker,
            serving=serving,
            metrics=metrics,
            look=look,
        )

    def log_tail(self, n: int) -> list[str]:
        return self.capture.tail(n) if self.capture is not None else []

    def log_write_errors(self) -> int | None:
        """Its keeper's write errors so far; None once no keeper writes for it."""
        return self.capture.stats.write_errors if self.capture is not None else None

    def saved_record(self) -> ServerRecord | None:
        """The record to persist, with the log position a successor resumes from."""
        if self.record is not None and self.capture is not None:
            self.record = replace(self.record, log=self.capture.position or self.record.log)
        return self.record

    def log_moved(self) -> bool:
        """The captured log moved past the position last saved."""
        record, cap = self.record, self.capture
        return record is not None and cap is not None and cap.position is not None and cap.position != record.log

    # ---- the log keeper ---------------------------------------------------------------------

    async def tend_keeper(self, control: ProcessControl, files: LogFiles) -> KeeperStatus | None:
        """A dead keeper is replaced on the same pipe (no server restart, no line lost); the keeper
        now, when that is news (a replacement, or a change of condition), else None."""
        if self.child is None:
            self.keeper = None
            return None
        before = self.keeper
        now = await asyncio.to_thread(control.tend_keeper, self.child.pid, files)
        self.keeper = now
        if now.condition != "replaced" and now.condition == (before.condition if before is not None else None):
            return None
        return now

    def describe_keeper(self) -> str:
        return self.keeper.describe() if self.keeper is not None else ""

    # ---- stop and hand over -----------------------------------------------------------------

    async def stop(self, tools: StopTools, marker: str, why: str) -> stopping.Stopped:
        """Stop the tree and verify the port and GPU memory are free; the log is closed (its last
        count still readable until `empty`)."""
        seen = self.obs.tree.pids if self.obs is not None else ()
        stopped = await stopping.stop_tree(tools, self.child, marker, tuple(seen), why)
        await self.close_log()
        return stopped

    def empty(self) -> None:
        """No tree from here on: what it showed stays for /status."""
        self.capture, self.child, self.record, self.history = None, None, None, None

    async def close_log(self) -> None:
        """Stop reading its output (a stop, or a handover: the position then covers every line read)."""
        if self.capture is not None:
            await asyncio.to_thread(self.capture.close)
