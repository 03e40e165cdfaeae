"""The other daemons of a group, as the owner meets them: a few named points of its work.

The owner (`supervisor.daemon.owner.Owner`) calls its `Peers` where a group changes what one node
does: `fit` (the settings a node applies), `judge` (the verdict it acts on), `capture` (the
members' evidence beside its own), `stop` and `launch` (the members with it), `publish` (the group's
part of /status), and `exits_for_group` (LWS recreates the group). One node has `NoPeers`: each
point is the plain owner's. A group has `supervisor.group.members.GroupPeers`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from probes.types import Observation
from supervisor.config.settings import Settings
from supervisor.group.verdict import NodeReport
from supervisor.policy.watchdog import History, Verdict
from supervisor.status.commands import Command
from supervisor.status.eventnames import EventName
from supervisor.status.snapshot import StatusSnapshot

T = TypeVar("T")


class Record(Protocol):
    def __call__(self, event: EventName, level: str = "info", /, **fields: Any) -> None: ...


Beating = Callable[[Awaitable[Any]], Awaitable[Any]]


@dataclass(frozen=True)
class Judged:
    verdict: Verdict | None  # what the owner acts on; None: nothing (a worker holds an incident)
    hold: str = ""  # a worker's reason to move to `hung` and wait for the leader
    # an incident the servers did not cause (a node away, partitioned, back without its server): why,
    # naming the node; the group relaunches on its rung, no ladder step. Empty: the ladder judges.
    same_rung: str = ""


@dataclass(frozen=True)
class Asked:
    """The group's leader asked this node for a bundle under its incident id (`POST /group/capture`)."""

    cause: str | None  # the incident this node holds for the leader, if any


@dataclass(frozen=True)
class Clearance:
    """Whether this node may launch now, and which rung: only a group's leader decides a rung."""

    rung: str | None  # the rung to launch; None: hold (not launched, tried again later)
    why: str = ""


@dataclass(frozen=True)
class MemberApi:
    """What the composition root serves to the group's other daemons (api/group.py, behind the
    signed gate api/groupgate.py): the leader answers joins; every node checks signed requests."""

    leads: bool
    join: Callable[..., Any] | None  # (node, instance, fingerprint, check, identity, address)
    check: Any  # supervisor.group.signing.RequestCheck


class Peers(Protocol):
    def attach(self, record: Record, beating: Beating) -> None:
        """Once, by the owner: the one way to record an event, and its heartbeat for long awaits."""
        ...

    def fit(self, settings: Settings) -> Settings:
        """The settings as this node applies them."""
        ...

    def scrapes_metrics(self) -> bool:
        """Whether the server's /metrics here is SGLang's (a worker's is a dummy health server's)."""
        ...

    async def start(self, poll_interval_s: Callable[[], float], sleep: Callable[[float], Awaitable[None]]) -> None: ...

    async def close(self) -> None: ...

    def judge(self, v: Verdict, own_state: str) -> Judged: ...

    async def capture(self, incident_id: str, own: Awaitable[T]) -> T:
        """This node's capture (`own`) and the members' at the same moment."""
        ...

    async def capture_alone(self, incident_id: str) -> None:
        """The members' capture for an incident this node takes no bundle of."""
        ...

    async def stop(self, own: Awaitable[bool]) -> bool:
        """This node's stop and the members' at once; this node's outcome."""
        ...

    async def launch(self, rung: str) -> None:
        """The members stopped with this node launch `rung` too."""
        ...

    async def clearance(self, rung: str, by_group: bool) -> Clearance:
        """Before a launch: a group's member asks its leader, unless the leader asked for this launch
        (`by_group`) and has already accepted this daemon."""
        ...

    def publish(self, snap: StatusSnapshot) -> StatusSnapshot: ...

    def bundle_doc(self, incident_id: str) -> Mapping[str, object] | None: ...

    def exits_for_group(self) -> bool:
        """True when an incident ends this daemon instead (LWS recreates the whole group)."""
        ...

    def refuses_reload(self, new: Settings, old: Settings) -> str | None: ...

    def refuses_command(self, cmd: Command) -> str | None:
        """Why the group cannot carry out this command at all (checked before anything stops)."""
        ...

    def asked(self, cmd: Command) -> Asked | None:
        """A diagnose from the leader for its incident; None: an ordinary diagnose."""
        ...

    def report(
        self, snap: StatusSnapshot, history: History | None, obs: Observation | None, wall: float
    ) -> NodeReport: ...

    def member_api(self, monotonic: Callable[[], float]) -> MemberApi | None:
        """The group's API on this daemon's port, if it is in a group."""
        ...

    @property
    def exit_code(self) -> int | None: ...


class NoPeers:
    """One node: every point is the plain owner's."""

    def attach(self, record: Record, beating: Beating) -> None:
        return None

    def fit(self, settings: Settings) -> Settings:
        return settings

    def scrapes_metrics(self) -> bool:
        return True

    async def start(self, poll_interval_s: Callable[[], float], sleep: Callable[[float], Awaitable[None]]) -> None:
        return None

    async def close(self) -> None:
        return None

    def judge(self, v: Verdict, own_state: str) -> Judged:
        return Judged(v)

    async def capture(self, incident_id: str, own: Awaitable[T]) -> T:
        return await own

    async def capture_alone(self, incident_id: str) -> None:
        return None

    async def stop(self, own: Awaitable[bool]) -> bool:
        return await own

    async def launch(self, rung: str) -> None:
        return None

    async def clearance(self, rung: str, by_group: bool) -> Clearance:
        return Clearance(rung)

    def publish(self, snap: StatusSnapshot) -> StatusSnapshot:
        return snap

    def bundle_doc(self, incident_id: str) -> Mapping[str, object] | None:
        return None

    def exits_for_group(self) -> bool:
        return False

    def refuses_reload(self, new: Settings, old: Settings) -> str | None:
        return None

    def refuses_command(self, cmd: Command) -> str | None:
        return None

    def asked(self, cmd: Command) -> Asked | None:
        return None

    def report(self, snap: StatusSnapshot, history: History | None, obs: Observation | None, wall: float) -> NodeReport:
        raise LookupError("one node: no group to report to")

    def member_api(self, monotonic: Callable[[], float]) -> MemberApi | None:
        return None

    @property
    def exit_code(self) -> int | None:
        return None
