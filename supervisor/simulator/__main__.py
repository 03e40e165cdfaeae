"""`python -m supervisor.simulator`: the SGLang simulator's entry point.

Spawned children re-import this module as `__mp_main__`, so it imports nothing at module level.
"""

from __future__ import annotations

import sys


def _main() -> int:
    from supervisor.simulator.server import main

    return main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(_main())
