"""The daemon's care of itself: surviving exceptions, counting its own write errors, leaving
`failed` after the cooldown, finishing what an exception or a dead predecessor left half done."""

from __future__ import annotations

import asyncio

import structlog

from supervisor.daemon import actions
from supervisor.daemon.core import Core
from supervisor.daemon.persist import OpenIncident
from supervisor.daemon.publish import iso
from supervisor.daemon.snapshot import IncidentView
from supervisor.policy.ladder import fresh_start, record_end, resume_rung
from supervisor.policy.lifecycle import State
from supervisor.policy.watchdog import Verdict
from supervisor.process.control import PendingLaunch

log = structlog.get_logger("supervisor")


async def survive(sup: Core, err: Exception) -> None:
    """An exception escaped a poll or a command: log it, count it, and leave no half-done restart.

    A restart cut short (state hung, diagnosing or restarting with nobody finishing it) is taken
    up again as an incident, so the server is stopped, verified and relaunched by the ladder.
    """
    sup.loop_errors += 1
    log.error("loop_error", error=repr(err), state=sup.lifecycle.state.value, exc_info=err)
    sup.metrics.loop_error(type(err).__name__)
    sup.journal.append("loop_error", error=repr(err)[:500], state=sup.lifecycle.state.value)
    sup.diagnosing = False
    sup.publish()
    if sup.lifecycle.state in (State.HUNG, State.DIAGNOSING, State.RESTARTING) and not sup.shutdown_requested:
        sup.resume_after_error = True


async def chores(sup: Core) -> bool:
    """What a tick does before it observes: the end of a `failed` cooldown, a restart an exception
    cut short, a launch the busy port deferred, orphans to reap. True when it acted (the tick ends)."""
    st = sup.lifecycle.state
    if st == State.FAILED and sup.failed_retry_at is not None and sup.clock.monotonic() >= sup.failed_retry_at:
        await leave_failed(
            sup, "failed_cooldown_over", "failed_cooldown_s passed: starting again from the preferred rung", 0
        )
        return True
    if sup.resume_after_error:
        sup.resume_after_error = False
        cause = sup.last_incident.cause if sup.last_incident is not None else "exited"
        why = "a restart was interrupted by an internal error"
        await actions.incident(sup, cause, Verdict(status="incident", cause=cause, reason=why), None)
        return True
    pending = sup.pending_launch
    if st == State.RESTARTING and pending is not None and sup.clock.monotonic() >= pending.at:
        sup.pending_launch = None
        await actions.launch(sup, pending.rung, after_incident=pending.after_incident)
        return True
    # Orphans of the tree re-parented to the daemon (a subreaper) are reaped once they exit.
    await asyncio.to_thread(sup.control.reap, sup.server_pid())
    await tend_keeper(sup)
    return False


async def tend_keeper(sup: Core) -> None:
    """The server's log keeper, every poll: a dead one is replaced on the same pipe (no server
    restart, no line lost), a stopped one is named; each change is journalled once."""
    if sup.server is None:
        sup.keeper = None
        return
    before = sup.keeper
    now = await asyncio.to_thread(sup.control.tend_keeper, sup.server.pid, sup.log_files())
    sup.keeper = now
    fields = {"pid": now.pid, "old_pid": now.old_pid, "why": now.why, "pipe_bytes": now.pipe_bytes}
    if now.condition == "replaced":
        sup.keepers_replaced += 1
        sup.metrics.keeper_replaced()
        sup.journal.append("log_keeper_replaced", **fields)
        log.warning("log_keeper_replaced", **fields)
    elif now.condition == (before.condition if before is not None else None):
        return
    elif now.condition == "stopped":
        sup.journal.append("log_keeper_stopped", **fields)
        log.error("log_keeper_stopped", **fields)
    elif now.condition == "lost":
        sup.journal.append("log_keeper_lost", **fields)
        log.error("log_keeper_lost", **fields)


def start_later(sup: Core, why: str) -> None:
    """Start-up failed before the first launch: try it from the tick after `backoff_initial_s`."""
    delay = sup.settings.restart.backoff_initial_s
    rung = resume_rung(sup.ladder, len(sup.settings.ladder), sup.settings.restart.start_from)
    sup.move(State.RESTARTING, f"{why}; launching in {delay:g} s")
    sup.pending_launch = PendingLaunch(rung, False, sup.clock.monotonic() + delay)
    sup.next_attempt_at = sup.pending_launch.at
    sup.publish()


async def leave_failed(sup: Core, event: str, why: str, rung: int) -> None:
    """Out of `failed` (cooldown over, or by hand): fresh retry, backoff and budget counters."""
    sup.ladder = fresh_start(sup.ladder)
    name = sup.settings.ladder[rung].name
    sup.journal.append(event, reason=why, rung=name)
    log.info(event, reason=why, rung=name)
    await actions.launch(sup, rung, after_incident=False)


def record_interrupted(sup: Core, inc: OpenIncident) -> None:
    """The previous daemon died capturing evidence: the incident is recorded as it stood."""
    sup.incidents += 1
    sup.metrics.incident(inc.cause, "none")
    sup.last_incident = IncidentView(
        id=inc.id, cause=inc.cause, at=iso(inc.at) or "", rung=inc.rung, detail="capture interrupted"
    )
    sup.journal.append("incident", **sup.last_incident.model_dump(), interrupted=True)
    log.warning("incident_interrupted", id=inc.id, cause=inc.cause, rung=inc.rung)
    sup.ladder = record_end(sup.ladder, inc.cause, sup.clock.wall())
