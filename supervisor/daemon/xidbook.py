"""What the supervisor remembers of GPU faults (Xid): a frozen record; supervisor.daemon.xids returns
the next one and the owner keeps it."""

from __future__ import annotations

from dataclasses import dataclass

from probes.xid import XidEvent
from supervisor.daemon.publish import iso
from supervisor.policy.xidpolicy import describe, xid_action
from supervisor.status.snapshot import XidView

RECENT = 20  # shown in /status


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
