"""GPU faults (Xid) in the supervisor: what the loop does with what probes.xid reports.

Each tick drains the watcher: every Xid on the daemon's GPUs (its CUDA_VISIBLE_DEVICES scope) is
journalled, counted, kept for /status and for the next incident and bundle. One that leaves a GPU
of the server unusable until reset (supervisor.policy.xidpolicy) blocks relaunching: the incident it
causes or explains ends in `failed`, naming the GPU, and so does any launch until an operator's
`start` (after a GPU reset) clears it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from probes.xid import XidEvent
from supervisor.daemon.publish import iso
from supervisor.policy.xidpolicy import blocking, describe, xid_action

if TYPE_CHECKING:
    from supervisor.daemon.core import Core

log = structlog.get_logger("supervisor")

EXPLAINS_S = 120.0  # an Xid this recent explains an incident (a rank that died, a stall)


def take(sup: Core) -> list[XidEvent]:
    """Drain the watcher: journal, count and keep each Xid; note a GPU that needs a reset."""
    book = sup.xids
    if sup.obs is not None and sup.obs.gpu.status == "ok":
        held = frozenset(p.gpu_index for p in sup.obs.gpu.processes)
        if held:
            book.server_gpus = held
    scope = sup.observer.gpu.scope
    # A neighbour's GPU (another daemon's server on this host, outside CUDA_VISIBLE_DEVICES) is not
    # this daemon's to count, alert on or name in its incidents: the neighbour's daemon does that.
    drained = book.watcher.drain() if book.watcher is not None else []
    events = [e for e in drained if e.gpu < 0 or scope.matches(e.gpu, e.uuid)]  # -1: a GPU that no longer answers
    if book.watcher is not None and book.watcher.status != "starting":
        now = (book.watcher.status, book.watcher.reason)
        if now != book.watch_seen:  # journalled once per change: an operator sees Xids are (not) watched
            book.watch_seen = now
            sup.journal.append("xid_watch", status=now[0], reason=now[1], gpus=list(book.watcher.gpus))
    for e in events:
        action = xid_action(e.xid)
        book.recent.append(e)
        book.unexplained.append(e)
        sup.metrics.xid(e.gpu, e.uuid, e.xid, action)
        sup.journal.append("gpu_xid", gpu=e.gpu, uuid=e.uuid, xid=e.xid, action=action, text=describe(e))
        (log.error if action == "reset_gpu" else log.warning)("gpu_xid", gpu=e.gpu, xid=e.xid, action=action)
    found = blocking(events, book.server_gpus)
    if found is not None and book.blocked is None:
        book.blocked = found
        sup.journal.append("gpu_blocked", gpu=found.gpu, uuid=found.uuid, xid=found.xid, reason=book.blocked_reason())
    return events


def explain(sup: Core, detail: str) -> tuple[str, list[XidEvent]]:
    """The incident's detail with the Xids that explain it (recent, not yet named by another)."""
    now = sup.clock.wall()
    book = sup.xids
    named = [e for e in book.unexplained if now - e.at <= EXPLAINS_S]
    book.unexplained = []
    if not named:
        return detail, []
    words = "; ".join(describe(e) for e in named)
    return (f"{detail} -- GPU fault: {words}" if detail else f"GPU fault: {words}"), named


def as_records(events: list[XidEvent]) -> list[dict[str, object]]:
    return [
        {"gpu": e.gpu, "uuid": e.uuid, "xid": e.xid, "at": iso(e.at), "action": xid_action(e.xid), "text": describe(e)}
        for e in events
    ]


def unblock(sup: Core) -> None:
    """An operator's `start`: the GPU was reset (or the operator accepts the risk)."""
    book = sup.xids
    if book.blocked is not None:
        sup.journal.append("gpu_unblocked", gpu=book.blocked.gpu, xid=book.blocked.xid, by="start")
        log.info("gpu_unblocked", gpu=book.blocked.gpu, xid=book.blocked.xid)
        book.blocked = None
