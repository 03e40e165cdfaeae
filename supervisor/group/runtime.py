"""A group daemon's own group state: its role, a member's held verdict, the leader's members.

`exit_code` is set in `restart = "lws"` mode once the group's evidence is written: the daemon
stops its server and exits with it, and LeaderWorkerSet recreates the group.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.config.settings import GroupSettings
from supervisor.group.client import GroupClient
from supervisor.group.credentials import GroupKeys
from supervisor.group.joining import JoinAnswer
from supervisor.group.leader import GroupLeader
from supervisor.group.verdict import GroupVerdict
from supervisor.status.causes import Cause


def state_identity(state_dir: Path) -> str:
    """A daemon's identity in its group (issue 54): its host and state directory, hashed. Stable
    across the daemon's restarts (its successor is the same node), different for a second daemon
    that claims the same node_rank with a state directory of its own."""
    try:
        where = str(state_dir.resolve())
    except OSError:
        where = str(state_dir)
    return hashlib.sha256(f"{socket.gethostname()}\0{where}".encode()).hexdigest()[:32]


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
    saved_at: Path | None = None  # where `members_stopped` outlives the daemon (state_dir/group.json)
    to_leader: GroupClient | None = None  # a worker's client for its leader (it asks before it launches)
    accepted: bool = False  # a worker: its leader's last join answer accepted this daemon (launch or wait)
    instance: str = field(default_factory=lambda: os.urandom(16).hex())  # this daemon's life, in its reports
    fingerprint: dict[str, str] = field(default_factory=dict)  # this node's group-relevant config
    own_rung: str | None = None  # what this node runs, as last published
    own_state: str = "starting"
    own_phase: str | None = None
    joins: dict[int, JoinAnswer] = field(default_factory=dict)  # the leader's last answer to each node
    mismatched: dict[int, str] = field(default_factory=dict)  # nodes named for another rung or config
    fixing: set[int] = field(default_factory=set)  # nodes the leader is relaunching on the group's rung
    # nodes the leader relaunched on the group's rung whose server has not reported ready since: node
    # 0 waits at the rendezvous for them, so they explain its start-up stall (bounded by absent_wait_s)
    relaunched: set[int] = field(default_factory=set)
    # members that asked to launch after node 0's server formed its group (they came back without
    # their servers): the group is relaunched together, on the same rung; why, per node
    rejoined: dict[int, str] = field(default_factory=dict)
    # the leader: node 0 has had a server in this daemon's life (launched or adopted); until then a
    # launch of node 0 relaunches every member with it (their servers, if any, belong to an old node 0)
    served: bool = False
    waiting_since: float | None = None  # the leader holds a stall for an absent node since (monotonic)
    waiting_for: int | None = None
    waiting_as: str = ""  # what the node waited for was: partition, absent, late, elsewhere (issue 54)
    # the leader: its own watchdog's incident, as judged this poll (held while the group waits for a
    # node): node 0's server does not serve, so neither does the group (`/readyz` 503, issue 54)
    own_failing: str = ""
    # the leader: node 0's own incident, named node 0, first seen at this poll round and moment: it
    # waits for a report from every member taken after it, so a member's fault seen at node 0 first
    # names the member (issue 54)
    confirm_from: tuple[int, float] | None = None
    # the leader: members whose held start-up stall was explained by an absent node: not their fault
    # when it goes ahead (the absent node came, the group formed without them); until the group relaunches
    stalled_for_absent: dict[int, int] = field(default_factory=dict)  # member -> the absent node
    # the leader: members whose group stop did not answer (partitioned, away): a server they run
    # after is from before the group's relaunch and can never meet node 0's; relaunched on the rung
    missed: set[int] = field(default_factory=set)
    # the leader: a node waited for came back while node 0's own incident stands: (node, poll round,
    # moment); node 0's server is given a few polls to recover on its own before the group relaunches
    healing: tuple[int, int, float] | None = None
    gone: set[int] = field(default_factory=set)  # nodes that did not answer during the wait under way
    identity: str = ""  # this daemon's state directory, hashed (`state_identity`): one per node_rank
    address: str = ""  # this daemon's API address, named to the leader when it joins
    holders: dict[int, str] = field(default_factory=dict)  # the leader: the identity each node's address reported
    absent_named: set[int] = field(default_factory=set)  # members journalled as away past absent_alert_s
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # those relaunches, held until done

    def mark_members_stopped(self, stopped: bool) -> None:
        """Kept in the state directory: a leader restarted during a group incident's backoff still
        launches the members its predecessor stopped (issue 34)."""
        self.members_stopped = stopped
        if self.saved_at is None:
            return
        tmp = self.saved_at.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"members_stopped": stopped}))
            os.replace(tmp, self.saved_at)
        except OSError:
            pass  # a full or read-only state disk: the memory still holds it for this daemon

    def load_saved(self) -> None:
        if self.saved_at is None:
            return
        try:
            doc = json.loads(self.saved_at.read_text())
        except (OSError, ValueError):
            return
        if isinstance(doc, dict) and doc.get("members_stopped") is True:
            self.members_stopped = True

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
