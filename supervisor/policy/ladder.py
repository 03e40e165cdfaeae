"""The fallback ladder as data, and `next_rung`: a pure choice of where to go after an incident.

Rung 0 is the base configuration, then the `[[fallback]]` rungs in order. After an incident:
a rung further down whose `on` list names the incident's hang class or cause is jumped to; else
the same rung is retried up to `retries_per_rung` times; else the ladder steps down one rung;
past the last rung, or over the hourly restart budget, the supervisor gives up (`failed`).

The recovery policy (docs/DECISIONS.md "Recovery never lengthens the outage") weighs what comes
before `next_rung` in `supervisor.policy.recovery.after_incident`: a try of a better rung that fails
goes straight back to the rung that served, and a rung that served keeps its standing. The state
that needs is here: `trial_from`, `free_relaunches`, and which attempt reached ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from supervisor.config.settings import RestartSettings, Rung
from supervisor.status.causes import Cause, HangClass

HOUR_S = 3600.0


@dataclass(frozen=True)
class Attempt:
    rung: str
    started_at: float  # wall clock, so it survives a daemon restart
    outcome: str = "running"  # "running", "ready", or the cause that ended it
    hang_class: str | None = None
    ended_at: float | None = None
    ready_at: float | None = None  # wall clock of ready: the attempt served (kept once it ends)


@dataclass(frozen=True)
class LadderState:
    current: int = 0
    failures_on_current: int = 0  # incidents on the current rung since it was entered or stable
    consecutive_failures: int = 0  # for the backoff; reset once a server is stable
    last_good: int | None = None  # the rung that most recently reached ready
    restart_times: tuple[float, ...] = ()  # wall clock of relaunches after incidents
    attempts: tuple[Attempt, ...] = ()  # newest last, bounded
    # A try of a rung above one that served (a promote, `promote_after_s`, a start from the
    # preferred rung): the rung to go back to if the try fails before it serves stably.
    trial_from: int | None = None
    # Same-rung relaunches that spent no retry (a fault after the rung served that its configuration
    # did not cause, a GPU fault) since the rung was entered or last served stably: at most one in a row.
    free_relaunches: int = 0

    def restarts_within_hour(self, now_wall: float) -> int:
        return sum(1 for t in self.restart_times if now_wall - t < HOUR_S)

    @property
    def served(self) -> bool:
        """The newest attempt reached ready (the incident now judged came after it served)."""
        return bool(self.attempts) and (self.attempts[-1].outcome == "ready" or self.attempts[-1].ready_at is not None)


@dataclass(frozen=True)
class Incident:
    cause: Cause
    hang_class: HangClass | None = None
    gpu_fault: bool = False  # the incident named a GPU fault (an Xid): the host's, not the rung's
    group_why: str = ""  # a group's incident the servers did not cause: which node, and what it was


@dataclass(frozen=True)
class Decision:
    action: Literal["relaunch", "give_up"]
    rung: int
    reason: str
    backoff_s: float = 0.0


MAX_EXPONENT = 60  # 2**60 times any sane initial delay is past any cap: no OverflowError from a huge count


def backoff(consecutive_failures: int, s: RestartSettings, rand: float) -> float:
    """Exponential from backoff_initial_s, capped at backoff_max_s, with +-jitter (rand in [0, 1))."""
    if consecutive_failures <= 0:
        return 0.0
    raw = s.backoff_initial_s * (2.0 ** min(consecutive_failures - 1, MAX_EXPONENT))
    base = min(raw, s.backoff_max_s)
    return max(0.0, base * (1.0 + s.backoff_jitter * (2.0 * rand - 1.0)))


def configuration_shaped(
    ladder: Sequence[Rung], state: LadderState, incident: Incident, speculative: Sequence[bool] = ()
) -> bool:
    """Whether the evidence says the rung's configuration caused the incident: a rung below answers
    it (`on` names its hang class or cause), or a speculative regression with a rung below that has
    no speculation. A GPU fault (Xid) never is: it is the host's."""
    if incident.gpu_fault:
        return False
    if incident.cause == "spec_regression":
        return any(i < len(speculative) and not speculative[i] for i in range(state.current + 1, len(ladder)))
    return _matching_rung(ladder, state.current, incident) is not None


# The flags that take CUDA graphs away (SGLang's, vLLM's): a rung that sets one answers a hang in
# graph capture even when its `on` does not name it (issue 49: the evidence says which rung fixes it).
_NO_GRAPH_FLAGS = ("disable-cuda-graph", "enforce-eager")


def _matching_rung(ladder: Sequence[Rung], current: int, incident: Incident) -> int | None:
    """The first rung below that answers the incident: its `on` names the cause or hang class, or, for a
    hang in CUDA-graph capture, it runs without CUDA graphs."""
    for i in range(current + 1, len(ladder)):
        on = ladder[i].on
        if incident.cause in on or (incident.hang_class is not None and incident.hang_class in on):
            return i
    if incident.hang_class == "cuda_graph_capture":
        for i in range(current + 1, len(ladder)):
            if any(ladder[i].args.get(flag) is True for flag in _NO_GRAPH_FLAGS):
                return i
    return None


def next_rung(
    ladder: Sequence[Rung],
    state: LadderState,
    incident: Incident,
    s: RestartSettings,
    *,
    now_wall: float,
    rand: float = 0.5,
    speculative: Sequence[bool] = (),
) -> Decision:
    """Where to relaunch after `incident` on rung `state.current` (pure).

    `state` already counts this incident (`record_incident` ran first, as the daemon does): the
    retries done on this rung are `failures_on_current - 1`, and the first backoff is
    `backoff_initial_s` (consecutive_failures == 1).
    """
    used = state.restarts_within_hour(now_wall)
    if used >= s.max_restarts_per_hour:
        return Decision("give_up", state.current, f"restart budget spent: {used} restarts in the last hour")
    delay = backoff(max(1, state.consecutive_failures), s, rand)
    if incident.cause == "spec_regression" and speculative:
        for i in range(state.current + 1, len(ladder)):
            if i < len(speculative) and not speculative[i]:
                return Decision(
                    "relaunch", i, f"speculative acceptance regressed: rung {ladder[i].name} has none", delay
                )
        return Decision("give_up", state.current, "speculative regression and no rung without speculation below")
    jump = _matching_rung(ladder, state.current, incident)
    if jump is not None:
        on = ladder[jump].on
        what = incident.cause if incident.cause in on and incident.hang_class not in on else incident.hang_class
        return Decision("relaunch", jump, f"rung {ladder[jump].name} answers {what}", delay)
    retried = max(0, state.failures_on_current - 1)
    if retried < s.retries_per_rung:
        n = retried + 1
        return Decision(
            "relaunch", state.current, f"retry {n}/{s.retries_per_rung} of rung {ladder[state.current].name}", delay
        )
    if state.current + 1 < len(ladder):
        nxt = state.current + 1
        return Decision("relaunch", nxt, f"rung {ladder[state.current].name} keeps failing: step down", delay)
    return Decision("give_up", state.current, f"ladder exhausted: last rung {ladder[state.current].name} failed")


MAX_ATTEMPTS = 50


def record_incident(state: LadderState, incident: Incident, now_wall: float) -> LadderState:
    attempts = state.attempts
    if attempts and attempts[-1].outcome in ("running", "ready"):
        last = replace(attempts[-1], outcome=incident.cause, hang_class=incident.hang_class, ended_at=now_wall)
        attempts = (*attempts[:-1], last)
    return replace(
        state,
        failures_on_current=state.failures_on_current + 1,
        consecutive_failures=state.consecutive_failures + 1,
        attempts=attempts[-MAX_ATTEMPTS:],
    )


def record_launch(
    state: LadderState, rung_index: int, rung_name: str, now_wall: float, *, after_incident: bool
) -> LadderState:
    """A launch of `rung_index`. One above the rung that last served is a try of a better rung
    (`trial_from` names the rung to go back to); one on or below it is not."""
    moved = rung_index != state.current
    times = tuple(t for t in state.restart_times if now_wall - t < HOUR_S)
    if after_incident:
        times += (now_wall,)
    good = state.last_good
    return replace(
        state,
        current=rung_index,
        failures_on_current=0 if moved else state.failures_on_current,
        free_relaunches=0 if moved else state.free_relaunches,
        trial_from=good if good is not None and rung_index < good else None,
        restart_times=times,
        attempts=(*state.attempts, Attempt(rung=rung_name, started_at=now_wall))[-MAX_ATTEMPTS:],
    )


def record_end(state: LadderState, outcome: str, now_wall: float) -> LadderState:
    """Close the newest attempt if it is still open ("running" or "ready"): a manual restart, a
    stop, a daemon shutdown or restart; every attempt ends with an outcome."""
    attempts = state.attempts
    if attempts and attempts[-1].outcome in ("running", "ready"):
        attempts = (*attempts[:-1], replace(attempts[-1], outcome=outcome, ended_at=now_wall))
    return replace(state, attempts=attempts)


def record_ready(state: LadderState, now_wall: float | None = None) -> LadderState:
    """Ready: the rung served. The backoff belongs to the launches that failed before it, never to
    the next, unrelated incident (it starts afresh); the retries spent before it served are given
    back, unless it already had its free relaunch since it was last stable (a rung that serves and
    fails again and again is judged by its retries, so such a loop steps down)."""
    attempts = state.attempts
    if attempts and attempts[-1].outcome == "running":
        attempts = (*attempts[:-1], replace(attempts[-1], outcome="ready", ready_at=now_wall))
    failures = 0 if state.free_relaunches == 0 else state.failures_on_current
    return replace(
        state, last_good=state.current, attempts=attempts, consecutive_failures=0, failures_on_current=failures
    )


def record_stable(state: LadderState) -> LadderState:
    """After `stable_s` of service the retry counters start afresh, and a try of this rung has
    succeeded (nothing to go back to)."""
    return replace(state, failures_on_current=0, consecutive_failures=0, free_relaunches=0, trial_from=None)


def fresh_start(state: LadderState) -> LadderState:
    """Counters afresh (retries, backoff, hourly budget) for a start out of `failed`, by hand or after
    `failed_cooldown_s`; the ladder's memory of what served (last_good, attempts) is kept."""
    return replace(state, failures_on_current=0, consecutive_failures=0, restart_times=())


def resume_rung(state: LadderState, ladder_len: int, start_from: Literal["last_good", "preferred"]) -> int:
    """Where a restarted daemon begins: never above a rung that served, never a rung that just failed.

    The ladder position already accounts for failures; the last-good rung guards against resuming
    on an experiment (a promotion back to the preferred rung) that was under way.
    """
    if start_from == "preferred":
        # ... unless a try of it was under way: the rung that served is known, and the try had not
        # proven itself (issue 49: never the top again because the daemon restarted mid-try).
        return state.trial_from if state.trial_from is not None else 0
    pos = state.current
    if state.last_good is not None:
        pos = max(pos, state.last_good)
    return min(max(pos, 0), ladder_len - 1)


def remap(state: LadderState, old: tuple[str, ...], new: tuple[str, ...]) -> LadderState:
    """A reload's ladder: the current and last-good rungs follow their names into the new ladder
    (a current rung that is gone leaves the position, capped to the new ladder's length)."""
    current = old[state.current] if state.current < len(old) else None
    idx = new.index(current) if current in new else min(state.current, len(new) - 1)
    good = state.last_good
    if good is not None and good < len(old):
        good = new.index(old[good]) if old[good] in new else None
    return replace(state, current=idx, last_good=good)
