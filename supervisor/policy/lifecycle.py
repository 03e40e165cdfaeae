"""The supervisor's lifecycle: one enum, one table of legal transitions, one place that changes it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal


class State(str, Enum):
    STOPPED = "stopped"  # not running, by request
    STARTING = "starting"  # launched, not yet ready
    READY = "ready"  # serving and healthy
    DEGRADED = "degraded"  # serving, but health failures below threshold or acceptance under its floor
    HUNG = "hung"  # a verdict of no progress; evidence capture follows at once
    DIAGNOSING = "diagnosing"  # capturing evidence
    RESTARTING = "restarting"  # stopping the tree, verifying release, backing off, relaunching
    FAILED = "failed"  # restart budget or ladder exhausted; waits for an operator


_S = State
LEGAL: dict[State, frozenset[State]] = {
    # A start refused because the port is held waits out its backoff in `restarting`.
    _S.STOPPED: frozenset({_S.STARTING, _S.STOPPED, _S.RESTARTING}),
    _S.STARTING: frozenset({_S.READY, _S.HUNG, _S.RESTARTING, _S.STOPPED, _S.DIAGNOSING, _S.FAILED}),
    _S.READY: frozenset({_S.DEGRADED, _S.HUNG, _S.RESTARTING, _S.STOPPED, _S.DIAGNOSING, _S.FAILED}),
    _S.DEGRADED: frozenset({_S.READY, _S.HUNG, _S.RESTARTING, _S.STOPPED, _S.DIAGNOSING, _S.FAILED}),
    _S.HUNG: frozenset({_S.DIAGNOSING, _S.RESTARTING, _S.STOPPED, _S.FAILED}),
    # A manual /diagnose of a live server returns to where it was.
    _S.DIAGNOSING: frozenset({_S.RESTARTING, _S.STOPPED, _S.STARTING, _S.READY, _S.DEGRADED, _S.FAILED}),
    _S.RESTARTING: frozenset({_S.STARTING, _S.STOPPED, _S.FAILED, _S.RESTARTING}),
    _S.FAILED: frozenset({_S.STARTING, _S.RESTARTING, _S.STOPPED, _S.FAILED}),
}

SERVING = frozenset({State.READY, State.DEGRADED})
SERVING_NAMES = frozenset(s.value for s in SERVING)  # the same, as /status spells them
RUNNING = frozenset({State.STARTING, State.READY, State.DEGRADED})
# An incident in hand: a restart is under way (a second is refused; one an exception cut short resumes).
RESTART_UNDER_WAY = frozenset({State.HUNG, State.DIAGNOSING, State.RESTARTING})


class IllegalTransition(RuntimeError):
    pass


@dataclass(frozen=True)
class Transition:
    old: State
    new: State
    at: float
    reason: str


class Lifecycle:
    """Holds the current state; `move` is the only way to change it and refuses illegal moves."""

    def __init__(self, initial: State = State.STOPPED, at: float = 0.0) -> None:
        self._state = initial
        self._since = at

    @property
    def state(self) -> State:
        return self._state

    @property
    def since(self) -> float:
        return self._since

    def move(self, new: State, at: float, reason: str = "") -> Transition:
        old = self._state
        if new not in LEGAL[old]:
            raise IllegalTransition(f"{old.value} -> {new.value} ({reason})")
        self._state = new
        if new != old:
            self._since = at
        return Transition(old, new, at, reason)


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
