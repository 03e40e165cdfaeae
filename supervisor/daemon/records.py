"""The owner's records, grouped: the counters, the one pending timer and the incident in hand (the
current server is a `supervisor.daemon.server.Server`). Only the owner
(`supervisor.daemon.owner.Owner`) holds and writes these; the helpers it calls get the few values
they need and return outcomes it applies.

`Counters` change on every poll, so they are a plain dataclass written in place by the owner alone;
`Pending` is frozen (a timer is replaced, never edited).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from supervisor.daemon.persist import Decided, OpenIncident
from supervisor.policy.lifecycle import State
from supervisor.status.snapshot import IncidentView

# What a pending timer does when it fires: launch a rung (a backoff after an incident, a launch a
# held port or GPU deferred, a start-up that failed), resume a predecessor's decision, or leave
# `failed` once `failed_cooldown_s` has passed.
PendingWhat = Literal["launch", "resume", "leave_failed"]
# How the loop ends: a shutdown (the server is stopped), a handoff (SIGUSR2: it is left running for a
# successor), or a group restart (`restart = "lws"`: LeaderWorkerSet recreates the whole group).
Leaving = Literal["shutdown", "handoff", "group_restart"]


@dataclass(frozen=True)
class Pending:
    """The one "do this later": `what` on `rung` at `at` (monotonic). The tick checks it first, as
    supervisord's BACKOFF state does; a command that arrives meanwhile goes through the dispatcher."""

    what: PendingWhat
    rung: int
    at: float
    after_incident: bool = False

    @property
    def waits_in(self) -> State:
        """The state this timer belongs to: leaving that state cancels it."""
        return State.FAILED if self.what == "leave_failed" else State.RESTARTING


@dataclass
class Counters:
    """Counts for /status and /metrics; each grows only in the owner."""

    incidents: int = 0
    restarts: int = 0
    loop_errors: int = 0
    port_refusals: int = 0  # launches refused in a row because the port was held
    gpu_refusals: int = 0  # ... because a stranger held GPU memory (supervisor.daemon.slate)
    unknown_observations: int = 0
    state_write_errors: int = 0
    bundle_write_errors: int = 0
    keepers_replaced: int = 0


@dataclass
class InHand:
    """The incident and decisions in hand: what is being captured, what the ladder decided, which
    commands are queued that a second one must not repeat."""

    last_incident: IncidentView | None = None
    open_incident: OpenIncident | None = None  # persisted while its capture runs
    decided: Decided | None = None  # persisted from the ladder's decision until the launch
    diagnosing: bool = False
    restart_pending: bool = False
    resume_after_error: bool = False  # a restart was cut short by an exception: finish it
    incident_ids: list[str] = field(default_factory=list)  # recent ids, so two in one second differ
