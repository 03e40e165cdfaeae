"""The daemon's signals held from the first instruction until its loop can queue them.

Python's start-up and the imports of pydantic, FastAPI and uvicorn take most of a second; until the
daemon's loop installs its handlers, SIGTERM, SIGHUP and SIGUSR2 would kill it by their default
action (an upgrade's SIGUSR2 sent right after a start did, 9 times in 10). So the console script
blocks them first thing (`hold`): the kernel keeps them pending, and `release` (once the handlers
that enqueue them run) delivers them to the loop. A blocked mask and pending signals survive
`execve`, which is how the SIGUSR2 handoff re-executes the daemon without a gap either: the old
image holds them again as soon as its loop ends for the handoff (supervisor.root.serve), so from
then to the new image's handlers they wait. What no code of ours covers is a fresh start's first
milliseconds, before the first line of Python (docs/SAFETY.md, "The handoff has no gap").
"""

from __future__ import annotations

import signal

HELD = frozenset({signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2})


def hold() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)


def release() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def held() -> bool:
    """Whether this thread blocks all of them now (the handoff's re-exec under way)."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, []) >= HELD
