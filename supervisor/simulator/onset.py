"""The side file benchmarks read to learn when a fault really began (never read by the supervisor)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence


def write_onset(
    path: str | None,
    scenario: str,
    requested: str,
    main_pid: int,
    unknown_flags: Sequence[str],
    onset: bool = True,
) -> None:
    """Atomically write `{"scenario", "onset_wall", "onset_monotonic", "pid", ...}`; no-op without a path.

    `onset=False` records a start without a fault: both onset times are null.
    """
    if not path:
        return
    record = {
        "scenario": scenario,
        "requested_scenario": requested,
        "onset_wall": time.time() if onset else None,
        "onset_monotonic": time.monotonic() if onset else None,
        "pid": main_pid,
        "writer_pid": os.getpid(),
        "unknown_flags": list(unknown_flags),
    }
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".onset-", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a benchmark aid must never change how the server behaves
