"""`promote` decided once for the REST route and the page's button (pure: a snapshot in, words out).

A promotion is a manual restart onto rung 0. It applies from a fallback rung, from `failed`, and
while a restart is under way; it is refused when the server already runs on rung 0 and when an
operator stopped the server: a promotion never undoes a stop (docs/DECISIONS.md, "promote on a
stopped server"), `start --rung <preferred>` does that on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.status.snapshot import StatusSnapshot


@dataclass(frozen=True)
class Refusal:
    status: int
    error: str
    message: str


def refusal(s: StatusSnapshot) -> Refusal | None:
    """Why `promote` does not apply now, or None when it does."""
    if not s.ladder:
        return Refusal(503, "failed", "the ladder is not loaded yet")
    preferred = s.ladder[0]
    if s.state in ("ready", "degraded", "starting") and (s.rung_index or 0) == 0:
        return Refusal(409, "conflict", f"already on the preferred rung {preferred}")
    if s.state == "stopped":
        return Refusal(
            409,
            "conflict",
            f"the server is stopped, and promote does not start a stopped server; "
            f'`sglang-supervisor start --rung {preferred}` (POST /start with {{"rung": "{preferred}"}}) starts it '
            "on the preferred rung",
        )
    return None


def last_failure(s: StatusSnapshot) -> str:
    """The preferred rung's last failure when it is the last incident, in words; else empty."""
    inc = s.last_incident
    if not s.ladder or inc is None or inc.rung != s.ladder[0]:
        return ""
    cls = f"/{inc.hang_class}" if inc.hang_class else ""
    return f"{s.ladder[0]} last failed with {inc.cause}{cls} at {inc.at} (bundle {inc.bundle or 'none'})"


def back_to(s: StatusSnapshot) -> str | None:
    """The rung a failed try goes back to: the one that served last, below the preferred one."""
    if not s.ladder or s.last_good_rung in (None, s.ladder[0]):
        return None
    return s.last_good_rung


def if_it_fails(s: StatusSnapshot) -> str:
    """What happens when the preferred rung fails again (issue 49): straight back to the rung that
    served, at once, the preferred rung not retried; with none known, its retries, then the ladder."""
    if not s.ladder:
        return ""
    preferred, back = s.ladder[0], back_to(s)
    if back is not None:
        return (
            f"If {preferred} fails before it has served stably, the daemon captures the evidence and goes "
            f"straight back to {back}, which served: no backoff, {preferred} not retried."
        )
    rest = s.ladder[1:]
    if not rest:
        return f"If {preferred} fails again, its retries are spent and the server is failed (not serving)."
    return (
        f"If {preferred} fails again, the daemon captures the evidence and steps down the ladder: "
        f"{', then '.join(rest)}, each after its retries; the server is down for each launch until one is ready."
    )


def consequence(s: StatusSnapshot) -> str:
    """The confirmation page's sentence: what the button does, and what follows a failure."""
    preferred = s.ladder[0] if s.ladder else "the preferred rung"
    memory = last_failure(s)
    return (
        f"stops the server (requests in flight fail) and launches it on the preferred rung {preferred} now; "
        "it is a manual restart, not charged to the rung that serves. "
        + if_it_fails(s)
        + (f" Note: {memory}." if memory else "")
    )


def accepted_message(s: StatusSnapshot) -> str:
    memory, back = last_failure(s), back_to(s)
    then = f"; if it fails before it serves: back to {back}, no backoff" if back else ""
    return f"promoting from {s.rung} to {s.ladder[0]}" + (f"; {memory}" if memory else "") + then
