"""Launching a server, as a helper of the owner: is the port free, then spawn the rung's command
with its output captured. Each step takes the values it needs and returns what happened; the owner
records it, fills its slot, and defers or fails the launch.

Only `supervisor.process` spawns: this calls it through the `ProcessControl` it is given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from supervisor.clock import Clock
from supervisor.daemon.adopt import ServerRecord, starttime_of
from supervisor.logs.reader import LogCapture
from supervisor.process.control import Child, LogFiles, ProcessControl, SpawnError, port_holder
from supervisor.process.leftovers import kept_on_port


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


async def spawn(control: ProcessControl, req: SpawnRequest, clock: Clock) -> Spawned | SpawnFailed:
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
