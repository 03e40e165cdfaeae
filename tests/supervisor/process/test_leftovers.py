"""The one `kill_leftovers` (supervisor.process.leftovers): every marker it is given, with real
processes. The daemon passes the saved marker and this state directory's derived one (an older
version saved a random marker); what either left running is stopped and the port verified free."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable

from probes.ports import port_accepts
from probes.proctree import find_tree
from supervisor.process import ServerProcess
from supervisor.process.leftovers import kill_leftovers

SpawnFn = Callable[..., ServerProcess]
WaitFn = Callable[..., bool]

SLEEPER = "import time; time.sleep(60)"
LISTENER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
time.sleep(60)
"""


def test_every_given_marker_is_swept(spawn: SpawnFn, marker: str, free_port: int, wait_until: WaitFn) -> None:
    older = f"test-older-{uuid.uuid4().hex[:8]}"
    mine = spawn([sys.executable, "-c", SLEEPER])
    theirs = spawn([sys.executable, "-c", LISTENER, str(free_port)], other_marker=older)
    assert wait_until(lambda: port_accepts("127.0.0.1", free_port) and find_tree(None, marker) != [])
    report = kill_leftovers((older, marker), "127.0.0.1", free_port, grace_s=0.5)
    assert report.ok, report
    assert {mine.pid, theirs.pid} <= set(report.pids_found)
    assert find_tree(None, marker) == [] and find_tree(None, older) == []
    assert report.port_free and wait_until(lambda: mine.poll() is not None and theirs.poll() is not None)


def test_a_single_marker_and_nothing_left(marker: str, free_port: int) -> None:
    report = kill_leftovers(marker, "127.0.0.1", free_port, port_wait_s=0.5)
    assert report.ok and report.pids_found == () and report.port_free


# A tree on the port with another marker: tests/supervisor/process/test_owners.py (kept unless
# its daemon is provably dead or it publishes this state directory).
