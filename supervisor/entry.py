"""The console script's entry point: hold the daemon's signals before anything slow is imported
(supervisor.common.sigmask says why), then hand over to the command line."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from supervisor.common import sigmask


def main(argv: Sequence[str] | None = None) -> int:
    sigmask.hold()
    from supervisor.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
