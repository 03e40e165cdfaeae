"""GPU faults (Xid) in the supervisor: what the loop does with what probes.xid reports.

Each tick drains the watcher: every Xid on the daemon's GPUs (its CUDA_VISIBLE_DEVICES scope) is
journalled, counted, kept for /status and for the next incident and bundle. One that leaves a GPU
of the server unusable until reset (supervisor.policy.xidpolicy) blocks relaunching: the incident it
causes or explains ends in `failed`, naming the GPU, and so does any launch until an operator's
`start` (after a GPU reset) clears it.

A helper of the owner: these functions are pure. Given the `XidBook` (frozen) and what the watcher
reported, each returns the next book and the `Note`s (journal events, with the Xid to count) that
the owner records; the owner keeps the book and drains the watcher.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from probes.gpuscope import DeviceScope
from probes.types import Observation
from probes.xid import XidEvent, XidWatcher
from supervisor.clock import iso
from supervisor.policy.xidpolicy import blocking, describe, xid_action
from supervisor.status.eventnames import EventName
from supervisor.status.snapshot import XidView

RECENT = 20  # shown in /status
EXPLAINS_S = 120.0  # an Xid this recent explains an incident (a rank that died, a stall)


# What the supervisor remembers of GPU faults: a frozen record; the functions below return the next one.
@dataclass(frozen=True)
class XidBook:
    recent: tuple[XidEvent, ...] = ()  # the last RECENT
    unexplained: tuple[XidEvent, ...] = ()  # not yet named by an incident or bundle
    blocked: XidEvent | None = None  # a GPU of the server needs a reset: no relaunch onto it
    server_gpus: frozenset[int] | None = None  # NVML indices where the tree held memory, last seen
    watch_seen: tuple[str, str] = ("", "")  # the watcher's (status, reason) last journalled

    def views(self) -> tuple[XidView, ...]:
        return tuple(
            XidView(gpu=e.gpu, uuid=e.uuid, xid=e.xid, at=iso(e.at) or "", action=xid_action(e.xid), text=describe(e))
            for e in self.recent
        )

    def blocked_reason(self) -> str | None:
        if self.blocked is None:
            return None
        return (
            f"GPU {self.blocked.gpu} needs a reset: {describe(self.blocked)}; not relaunching onto it"
            " (reset the GPU, e.g. nvidia-smi -r, or drain the node, then: sglang-supervisor start)"
        )


@dataclass(frozen=True)
class Note:
    """One event for the owner to record (`level`: the log line's); `xid`: count it in metrics."""

    event: EventName
    fields: dict[str, object] = field(default_factory=dict)
    level: str = "info"
    xid: XidEvent | None = None


@dataclass(frozen=True)
class Watch:
    """What the watcher reported this tick: its status, once it is past `starting`, and its drain."""

    status: str
    reason: str
    gpus: tuple[int, ...]
    drained: tuple[XidEvent, ...]


def drain(
    book: XidBook, watcher: XidWatcher | None, obs: Observation | None, scope: DeviceScope
) -> tuple[XidBook, list[Note]]:
    """This tick's drain of the watcher (the one I/O here), then `take`."""
    watch = None
    if watcher is not None:
        watch = Watch(watcher.status, watcher.reason, watcher.gpus, tuple(watcher.drain()))
    return take(book, watch, obs, scope)


def take(book: XidBook, watch: Watch | None, obs: Observation | None, scope: DeviceScope) -> tuple[XidBook, list[Note]]:
    """The watcher's drain into the book: each Xid kept; a GPU that needs a reset noted as blocking."""
    notes: list[Note] = []
    if obs is not None and obs.gpu.status == "ok":
        held = frozenset(p.gpu_index for p in obs.gpu.processes)
        if held:
            book = replace(book, server_gpus=held)
    if watch is None:
        return book, notes
    # A neighbour's GPU (another daemon's server on this host, outside CUDA_VISIBLE_DEVICES) is not
    # this daemon's to count, alert on or name in its incidents: the neighbour's daemon does that.
    events = [e for e in watch.drained if e.gpu < 0 or scope.matches(e.gpu, e.uuid)]  # -1: a GPU that no longer answers
    if watch.status != "starting":
        now = (watch.status, watch.reason)
        if now != book.watch_seen:  # journalled once per change: an operator sees Xids are (not) watched
            book = replace(book, watch_seen=now)
            notes.append(Note("xid_watch", {"status": now[0], "reason": now[1], "gpus": list(watch.gpus)}))
    for e in events:
        action = xid_action(e.xid)
        fields: dict[str, object] = {"gpu": e.gpu, "uuid": e.uuid, "xid": e.xid, "action": action, "text": describe(e)}
        notes.append(Note("gpu_xid", fields, "error" if action == "reset_gpu" else "warning", e))
    if events:
        book = replace(book, recent=(*book.recent, *events)[-RECENT:], unexplained=(*book.unexplained, *events))
    found = blocking(events, book.server_gpus)
    if found is not None and book.blocked is None:
        book = replace(book, blocked=found)
        fields = {"gpu": found.gpu, "uuid": found.uuid, "xid": found.xid, "reason": book.blocked_reason()}
        notes.append(Note("gpu_blocked", fields, "error"))
    return book, notes


def explain(book: XidBook, now_wall: float, detail: str) -> tuple[XidBook, str, list[XidEvent]]:
    """The incident's detail with the Xids that explain it (recent, not yet named by another); the
    book then holds none unexplained."""
    named = [e for e in book.unexplained if now_wall - e.at <= EXPLAINS_S]
    book = replace(book, unexplained=())
    if not named:
        return book, detail, []
    words = "; ".join(describe(e) for e in named)
    return book, (f"{detail} -- GPU fault: {words}" if detail else f"GPU fault: {words}"), named


def as_records(events: list[XidEvent]) -> list[dict[str, object]]:
    return [
        {"gpu": e.gpu, "uuid": e.uuid, "xid": e.xid, "at": iso(e.at), "action": xid_action(e.xid), "text": describe(e)}
        for e in events
    ]


def unblock(book: XidBook) -> tuple[XidBook, Note | None]:
    """An operator's `start`: the GPU was reset (or the operator accepts the risk)."""
    if book.blocked is None:
        return book, None
    note = Note("gpu_unblocked", {"gpu": book.blocked.gpu, "xid": book.blocked.xid, "by": "start"})
    return replace(book, blocked=None), note
