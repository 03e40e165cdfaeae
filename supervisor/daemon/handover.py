"""Daemon restarts that keep the server: adopting a predecessor's server, handing over to a successor.

`adopt_server` runs at start, before anything is stopped: the server named in state.json is taken
over when `supervisor.daemon.adopt.refusal` finds pid, start time and marker all match; otherwise the
caller stops whatever carries the marker, as before. `hand_over` is the SIGUSR2 exit: state saved
(the log position included), the server left running. Both work on the supervisor's `Core`.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import structlog

from supervisor.daemon.adopt import refusal
from supervisor.daemon.commands import CommandResult, finish
from supervisor.daemon.core import Core
from supervisor.logs.capture import LogCapture
from supervisor.policy.lifecycle import State

log = structlog.get_logger("supervisor")


async def hand_over(sup: Core) -> None:
    """Exit for a successor (an upgrade): the server keeps running, state.json says how to adopt it."""
    sup.notifier.stopping()
    if sup.capture is not None:
        cap = sup.capture
        await asyncio.to_thread(cap.close)  # its position now covers every line read
    sup.persist()
    record = sup.server_record
    assert record is not None
    sup.journal.append("daemon_handoff", pid=record.pid, rung=record.rung, state=sup.lifecycle.state.value)
    log.info("daemon_handoff", pid=record.pid, rung=record.rung, state=sup.lifecycle.state.value)
    await sup.observer.close()
    while not sup.queue.empty():
        cmd = sup.queue.get_nowait()
        finish(cmd, CommandResult("failed", "daemon handed over to its successor", sup.lifecycle.state.value))


def refuse_adoption(sup: Core, why: str) -> None:
    """The saved server is not taken over; the caller stops whatever carries the marker."""
    record = sup.server_record
    sup.server_record = None
    if record is not None:
        sup.journal.append("adoption_refused", pid=record.pid, reason=why)
        log.warning("adoption_refused", pid=record.pid, reason=why)


async def adopt_server(sup: Core) -> bool:
    """At start: take over the server a predecessor left running, if it is provably that server.

    Ladder position and attempt stay as saved; probes start afresh and the usual rules judge it
    from `starting` (a serving server is `ready` at the first good health probe). False when
    there is nothing to adopt or it cannot be proven ours (the caller then stops it by marker).
    """
    record = sup.server_record
    if record is None:
        return False
    rung = sup.settings.rung_index(record.rung)
    why = await asyncio.to_thread(refusal, record, sup.marker)
    if why is None and rung is None:
        why = f"its rung {record.rung!r} is no longer in the ladder"
    if why is not None:
        refuse_adoption(sup, why)
        return False
    assert rung is not None
    sup.ladder = replace(sup.ladder, current=rung)
    sup.fresh_server_view(record.launched_wall)
    sup.adopted = True
    files = sup.log_files()
    sup.capture = LogCapture(
        files.dir, memory_lines=sup.settings.logs.memory_lines, start=record.log, monotonic=sup.clock.monotonic
    ).start()
    sup.log_seq = 0
    sup.server = await asyncio.to_thread(sup.control.adopt, record.pid, record.starttime, sup.marker)
    sup.persist()
    sup.journal.append("server_adopted", pid=record.pid, rung=record.rung, starttime=record.starttime)
    log.info("server_adopted", pid=record.pid, rung=record.rung)
    sup.move(State.STARTING, f"adopted server pid {record.pid} on rung {record.rung}")
    return True
