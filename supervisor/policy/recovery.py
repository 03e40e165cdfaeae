"""The decisions around the ladder, pure: what follows an incident, a refused launch, a serving poll
and a daemon's start. `next_rung` (supervisor.policy.ladder) chooses the rung; these functions
weigh what comes before and beside it: a manual restart or a rung the group forces, a GPU that
needs a reset (Xid), a server that did not release its port or GPU memory, a group that LWS
recreates, the refused-launch backoff, the serving step (stable, promotion) and a predecessor's
decision resumed at start. The owner (supervisor.daemon.owner) gathers the facts, calls one, and
carries out what it returns: no I/O, no clock reads, no logging here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from supervisor.config.settings import RestartSettings, Rung
from supervisor.policy.gpufit import refusals_to_cap
from supervisor.policy.ladder import (
    Decision,
    Incident,
    LadderState,
    backoff,
    configuration_shaped,
    next_rung,
    record_end,
    record_incident,
    resume_rung,
)

# ---- after an incident ----------------------------------------------------------------------

# A group's relaunch forced on its rung, then why: "node 2 was partitioned 150 s", "node 1 came back
# without its server" (issue 54: a partition was booked as "a node was away").
GROUP_SAME_RUNG = "the group relaunches on its rung"


def exits_for_group(is_leader: bool, restart: Literal["daemon", "lws"]) -> bool:
    """`restart = "lws"`: a group's leader exits after the group's evidence, for LeaderWorkerSet to
    recreate every pod of the group, instead of restarting the server itself."""
    return is_leader and restart == "lws"


@dataclass(frozen=True)
class Failed:
    """No relaunch: `failed` with `reason`, the ladder untouched."""

    reason: str


@dataclass(frozen=True)
class Recovery:
    """The ladder after the incident and its decision (relaunch a rung after a backoff, or give up)."""

    ladder: LadderState
    decision: Decision


@dataclass(frozen=True)
class AfterStop:
    """What the stop of the incident's server left: whether the port and GPU memory were verified
    free, and the reason a GPU of the server needs a reset (an Xid), if one does."""

    released: bool
    xid_blocked: str | None = None


def after_incident(
    ladder: Sequence[Rung],
    state: LadderState,
    incident: Incident,
    stop: AfterStop,
    s: RestartSettings,
    *,
    manual: bool,
    forced_rung: int | None,
    now_wall: float,
    rand: float,
    speculative: Sequence[bool] = (),
) -> Failed | Recovery:
    """What follows an incident once its server is stopped: the relaunch that brings the model back
    soonest (docs/DECISIONS.md "Recovery never lengthens the outage").

    A GPU that needs a reset fails at once (a relaunch onto it fails the same way); so does a server
    that kept its port or GPU memory under `release_policy = "fail"`. A manual restart ends the
    attempt as `manual` and relaunches the rung asked for (else the current one) at once; a rung
    forced by the group (a node was away) is relaunched at once too, the attempt ended with the
    incident's cause but none of the rung's retries spent, within the hourly budget like any other. Then, in order:
    - a try of a rung above the one that served (a promote) that fails before it served stably goes
      straight back to that rung: no walk down the ladder, no backoff, the try not repeated;
    - a rung that served keeps its standing: an incident after it served, or a GPU fault (Xid), is
      relaunched on the same rung at once, spending no retry, unless the evidence says the rung's
      configuration caused it (`configuration_shaped`); one such free relaunch in a row, so a rung
      that keeps failing is judged by its retries;
    - otherwise the ladder decides (`next_rung`: `on` jumps, retries, steps down, the budget).
    Every relaunch after an incident counts against the hourly budget."""
    if stop.xid_blocked is not None:
        return Failed(stop.xid_blocked)
    if not stop.released and s.release_policy == "fail":
        return Failed("the old server did not release its port or GPU memory (release_policy=fail)")
    if manual:
        state = record_end(state, "manual", now_wall)
        target = forced_rung if forced_rung is not None else state.current
        return Recovery(state, Decision("relaunch", target, "manual restart", 0.0))
    if forced_rung is not None:
        # Only a group forces a rung without a person (a node that was away, the daemon's `act`): the
        # servers were not at fault, so the attempt ends with the cause but spends none of the rung's
        # retries; the hourly restart budget still counts the relaunch and bounds it (issue 54: a
        # group that forced its rung for ever looped without end).
        state = record_end(state, incident.cause, now_wall)
        used = state.restarts_within_hour(now_wall)
        if used >= s.max_restarts_per_hour:
            return Recovery(state, Decision("give_up", state.current, _spent(used)))
        why = f"{GROUP_SAME_RUNG}: {incident.group_why or 'a node was away'}, not the servers' fault"
        return Recovery(state, Decision("relaunch", forced_rung, why, 0.0))
    used = state.restarts_within_hour(now_wall)
    name = ladder[state.current].name
    back = state.trial_from
    if back is not None and back > state.current and used < s.max_restarts_per_hour:
        state = replace(_ended(state, incident, now_wall), trial_from=None)
        why = f"the try of rung {name} failed ({_what(incident)}) before it served stably"
        why += f": back to rung {ladder[back].name}, which served"
        return Recovery(state, Decision("relaunch", back, why, 0.0))
    free = (state.served or incident.gpu_fault) and not configuration_shaped(ladder, state, incident, speculative)
    if free and state.free_relaunches == 0 and used < s.max_restarts_per_hour:
        state = replace(_ended(state, incident, now_wall), free_relaunches=1)
        what = "a GPU fault (Xid)" if incident.gpu_fault else f"{_what(incident)} after it served"
        why = f"rung {name} keeps its standing: {what}, not its configuration; relaunched on it"
        return Recovery(state, Decision("relaunch", state.current, why, 0.0))
    state = record_incident(state, incident, now_wall)
    decision = next_rung(ladder, state, incident, s, now_wall=now_wall, rand=rand, speculative=tuple(speculative))
    return Recovery(state, decision)


def _spent(used: int) -> str:
    return f"restart budget spent: {used} restarts in the last hour"  # the ladder's words (next_rung)


def _what(incident: Incident) -> str:
    return incident.cause + (f"/{incident.hang_class}" if incident.hang_class else "")


def _ended(state: LadderState, incident: Incident, now_wall: float) -> LadderState:
    """The attempt ends with the incident, which spends none of the rung's retries."""
    attempts = state.attempts
    if attempts and attempts[-1].outcome in ("running", "ready"):
        last = replace(attempts[-1], outcome=incident.cause, hang_class=incident.hang_class, ended_at=now_wall)
        attempts = (*attempts[:-1], last)
    return replace(state, attempts=attempts)


# ---- a refused launch -------------------------------------------------------------------------


@dataclass(frozen=True)
class Refused:
    """A launch refused: `fail` now (strictly), or try again after `delay_s`; `tell_blocked` once the
    backoff reaches its cap (the `launch_blocked` event, said once)."""

    fail: bool
    delay_s: float = 0.0
    tell_blocked: bool = False


def port_refused(refusals: int, s: RestartSettings, rand: float) -> Refused:
    """The port is held by a process this daemon may not stop: wait on the refused-launch backoff."""
    return Refused(fail=False, delay_s=backoff(refusals, s, rand))


def gpu_refused(refusals: int, s: RestartSettings, rand: float, *, strict: bool) -> Refused:
    """Processes outside the server hold GPU memory ([slate] gpu_strangers): `failed` now, strictly;
    else wait on the refused-launch backoff, told once when it reaches its cap."""
    if strict:
        return Refused(fail=True)
    cap = refusals_to_cap(s.backoff_initial_s, s.backoff_max_s)
    return Refused(fail=False, delay_s=backoff(refusals, s, rand), tell_blocked=refusals == cap)


# ---- the serving step -------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingStep:
    """A serving poll's steps beside the verdict: mark the server stable (once per launch), promote
    it back to the preferred rung (a `manual` restart to rung 0)."""

    stable: bool = False
    promote: bool = False


def serving_step(
    s: RestartSettings,
    *,
    now: float,
    ready_at: float | None,
    stable_marked: bool,
    rung: int,
    ready: bool,
) -> ServingStep:
    """`stable` once `stable_s` after ready; a promotion once `promote_after_s` (when set) after
    ready on a lower rung, while `ready` (a degraded server is not promoted)."""
    if ready_at is None:
        return ServingStep()
    up = now - ready_at
    stable = not stable_marked and up >= s.stable_s
    promote = s.promote_after_s > 0 and rung > 0 and up >= s.promote_after_s and ready
    return ServingStep(stable=stable, promote=promote)


# ---- a daemon's start ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StayStopped:
    """The operator's stop outlives the daemon."""

    reason: str = "stopped by request before the daemon restarted (start it: sglang-supervisor start)"


@dataclass(frozen=True)
class Resume:
    """A predecessor decided a relaunch and was gone before making it: it stands, after `wait_s`."""

    rung: int
    wait_s: float


@dataclass(frozen=True)
class Launch:
    rung: int


@dataclass(frozen=True)
class Wait:
    """Nothing to start (`autostart` off): the daemon waits for a command."""


def at_start(
    state: LadderState,
    ladder_len: int,
    s: RestartSettings,
    *,
    autostart: bool,
    stopped_by_request: bool,
    decided_rung: int | None,
    decided_launch_at: float | None,
    now_wall: float,
) -> StayStopped | Resume | Launch | Wait:
    """What a daemon does first once no server was adopted: stay stopped (the operator's stop),
    resume a predecessor's decision (the rung that just failed is not tried again; the wait left of
    its backoff, at most `backoff_max_s`), or launch the rung the ladder resumes from."""
    if not autostart:
        return Wait()
    if stopped_by_request:
        return StayStopped()
    if decided_rung is not None and decided_launch_at is not None:
        return Resume(decided_rung, min(max(0.0, decided_launch_at - now_wall), s.backoff_max_s))
    return Launch(resume_rung(state, ladder_len, s.start_from))
