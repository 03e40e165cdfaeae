"""A loaded host for integration tests: CPU hogs pinned to one CPU beside the server, and the
server's tree pinned there with them (tests/integration/test_starved_start.py, test_spin_beside_hogs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from probes.proctree import scan_tree

HOGS = 6  # one pinned CPU shared by 7: the tree's compile thread gets ~0.14 cores (< cpu_progress_cores)
CPU = max(os.sched_getaffinity(0))
ALL = os.sched_getaffinity(0)


@contextmanager
def hogs() -> Iterator[None]:
    code = f"import os\nos.sched_setaffinity(0, {{{CPU}}})\nwhile True: pass"
    # Each hog in a session of its own: with sched_autogroup (most desktop and many server kernels)
    # a session is one scheduling group, and the server's session competes with each hog's as an
    # equal, as it did on the H200 beside 48 CPU-bound processes.
    procs = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for _ in range(HOGS)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def pin_tree(root: int, cpus: set[int]) -> int:
    """Every thread of the tree onto `cpus`; new threads and children inherit it. Threads pinned."""
    pinned = 0
    for pid in scan_tree(root, None):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
                pinned += 1
            except OSError:  # exited under us
                continue
    return pinned
