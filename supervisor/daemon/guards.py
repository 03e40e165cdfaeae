"""Refusals and names that keep the record straight: a launch onto a held port is refused and
retried later, and every incident gets an id of its own."""

from __future__ import annotations

import asyncio

import structlog

from supervisor.daemon.core import Core
from supervisor.diagnostics import new_incident_id
from supervisor.policy.ladder import backoff
from supervisor.policy.lifecycle import State
from supervisor.process.control import PendingLaunch, port_holder

log = structlog.get_logger("supervisor")


async def port_available(sup: Core, rung_index: int, *, after_incident: bool) -> bool:
    """A launch onto a port someone else holds would only exit at once, again and again: it is
    refused with the holder named, and retried after a growing backoff (the tick relaunches)."""
    srv = sup.settings.server
    holder = await asyncio.to_thread(port_holder, srv.host, srv.port)
    if holder is None:
        sup.port_refusals = 0
        sup.pending_launch = None
        sup.next_attempt_at = None
        return True
    sup.port_refusals += 1
    delay = backoff(sup.port_refusals, sup.settings.restart, sup.random())
    name = sup.settings.ladder[rung_index].name
    reason = f"port {srv.port} is held by {holder}: not launching rung {name}; next try in {delay:.1f} s"
    defer_launch(sup, rung_index, after_incident, delay, reason, "port_busy", port=srv.port, holder=holder)
    return False


def defer_launch(
    sup: Core, rung_index: int, after_incident: bool, delay: float, reason: str, refusal: str, **fields: object
) -> None:
    """A launch refused now (`refusal`: the `launches_refused_total` reason): journalled, counted,
    and tried again after `delay` through the one pending launch the tick advances."""
    log.error("launch_refused", reason=reason, backoff_s=round(delay, 3))
    rung = sup.settings.ladder[rung_index].name
    sup.journal.append("launch_refused", rung=rung, **fields, backoff_s=round(delay, 3))
    sup.metrics.launch_refused(refusal)
    if sup.lifecycle.state != State.RESTARTING:
        sup.move(State.RESTARTING, reason)
    sup.reason = reason
    sup.pending_launch = PendingLaunch(rung_index, after_incident, sup.clock.monotonic() + delay)
    sup.next_attempt_at = sup.pending_launch.at
    sup.publish()


def unique_incident_id(sup: Core, cause: str) -> str:
    """The time-and-cause id, with `-2`, `-3`... when that second already has one (two restarts
    0.28 s apart got the same id, and the second bundle overwrote the first)."""
    base = new_incident_id(sup.clock.wall(), cause)
    diag = sup.settings.state_dir / "diagnostics"
    candidate, n = base, 1
    while candidate in sup.incident_ids or (diag / candidate).exists():
        n += 1
        candidate = f"{base}-{n}"
    sup.incident_ids.append(candidate)
    del sup.incident_ids[:-100]
    return candidate
