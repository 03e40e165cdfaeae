"""Figures said the same way by `status` and the page, so the two never seem to disagree."""

from __future__ import annotations


def restarts_text(since_start: object, last_hour: object) -> str:
    """The two restart figures, each with what it counts: one resets when the daemon restarts, the
    other (the budget's window, kept in state.json) does not (issue 38: "restarts 0 (1 in the last
    hour)" after a daemon restart read as a contradiction)."""
    return f"{since_start} since the daemon started; {last_hour} in the last hour (the budget's window)"
