"""Adoption, as a helper of the owner: a restarted daemon takes over the server its predecessor
left running when `supervisor.daemon.adopt.refusal` proves it that server (pid, start time and
marker all match). Returns what it took over, or why not; the owner fills its slot or refuses."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from supervisor.clock import Clock
from supervisor.daemon.adopt import ServerRecord, refusal
from supervisor.logs.reader import LogCapture
from supervisor.process.control import Child, LogFiles, ProcessControl


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
