"""`logs --previous` across a rotation: the previous launch's lines are found by inode wherever the
keeper's renames put them, and nothing of the current launch is shown."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from api.launchlog import NoPreviousLaunch, previous_launch
from supervisor.status.journal import Journal


def test_the_previous_launch_spans_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    old = tmp_path / "server.log.1"
    old.write_bytes(b"launch one line\nlaunch two a\n")
    log.write_bytes(b"launch two b\nlaunch three\n")
    j = Journal(tmp_path / "events.jsonl")
    j.append("server_launched", rung="base", pid=1, log_start={"inode": os.stat(old).st_ino, "offset": 0})
    start_two = len(b"launch one line\n")
    j.append("server_launched", rung="base", pid=2, log_start={"inode": os.stat(old).st_ino, "offset": start_two})
    j.append("server_launched", rung="safe", pid=3, log_start={"inode": os.stat(log).st_ino, "offset": 13})
    prev = previous_launch(j, log, 100)
    assert (prev.rung, prev.pid) == ("base", 2)
    assert prev.lines == [b"launch two a", b"launch two b"]
    assert previous_launch(j, log, 1).lines == [b"launch two b"]


def test_no_previous_launch_says_why(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"x\n")
    j = Journal(tmp_path / "events.jsonl")
    with pytest.raises(NoPreviousLaunch, match="no launch before the current one"):
        previous_launch(j, log, 10)
    j.append("server_launched", rung="base", pid=1)
    j.append("server_launched", rung="base", pid=2, log_start=None)
    with pytest.raises(NoPreviousLaunch, match="older daemon"):
        previous_launch(j, log, 10)
