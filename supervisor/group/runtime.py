"""A group daemon's own group state: its role, a member's held verdict, the leader's members.

`exit_code` is set in `restart = "lws"` mode once the group's evidence is written: the daemon
stops its server and exits with it, and LeaderWorkerSet recreates the group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from supervisor.config.settings import GroupSettings
from supervisor.group.credentials import GroupKeys
from supervisor.group.leader import GroupLeader
from supervisor.policy.group import GroupVerdict
from supervisor.status.causes import Cause


@dataclass
class GroupRuntime:
    settings: GroupSettings
    leader: GroupLeader | None  # node 0 only
    keys: GroupKeys  # what this node signs and checks with (supervisor/group/signing.py)
    held_cause: Cause | None = None  # a member's own incident, held for the leader
    held_reason: str = ""
    captured: str | None = None  # the group incident this node last captured a bundle for
    verdict: GroupVerdict = field(default_factory=lambda: GroupVerdict("ok", reason="not judged yet"))
    exit_code: int | None = None
    members_stopped: bool = False  # the leader stopped its members: its next launch launches them too

    @property
    def node(self) -> int:
        return self.settings.node_rank

    @property
    def is_leader(self) -> bool:
        return self.settings.is_leader

    def others(self) -> list[tuple[int, str]]:
        """The other nodes and their daemon addresses, as far as this node's config names them."""
        out: list[tuple[int, str]] = []
        if not self.is_leader and self.settings.leader is not None:
            out.append((0, self.settings.leader))
        out.extend((i + 1, a) for i, a in enumerate(self.settings.members) if i + 1 != self.node)
        return out

    def bundle_doc(self, incident_id: str, bundles: dict[int, str | None] | None = None) -> dict[str, object]:
        """The `group` section of this node's bundle: which node it is, and the other nodes' bundles."""
        known = bundles or {}
        return {
            "node": self.node,
            "nnodes": self.settings.nnodes,
            "role": "leader" if self.is_leader else "worker",
            "incident": incident_id,
            "nodes": [{"node": n, "address": a, "bundle": known.get(n, incident_id)} for n, a in self.others()],
        }
