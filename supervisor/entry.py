"""The console script's entry point: hold the daemon's signals before anything slow is imported.

Python's start-up and the imports of pydantic, FastAPI and uvicorn take most of a second; until the
daemon's loop installs its handlers, SIGTERM, SIGHUP and SIGUSR2 would kill it by their default
action (an upgrade's SIGUSR2 sent right after a start did, 9 times in 10). So they are blocked
first thing: the kernel keeps them pending, and `release` (once the handlers that enqueue them run)
delivers them to the loop. A blocked mask and pending signals survive `execve`, which is how the
SIGUSR2 handoff re-executes the daemon without a gap either.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

HELD = frozenset({signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2})


def hold() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)


def release() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def main(argv: Sequence[str] | None = None) -> int:
    hold()
    from supervisor.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
