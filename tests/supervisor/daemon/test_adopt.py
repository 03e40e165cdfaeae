"""What proves a saved server is ours (pid, start time and marker, never one alone), with real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.daemon.adopt import ServerRecord, refusal, starttime_of
from supervisor.daemon.persist import Persisted, load, save
from supervisor.logs.reader import LogPosition
from supervisor.policy.ladder import LadderState
from supervisor.process import ServerProcess
from supervisor.process.control import EXIT_UNKNOWN, AdoptedChild

SpawnFn = Callable[..., ServerProcess]
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def record_of(pid: int, starttime: int) -> ServerRecord:
    return ServerRecord(pid=pid, starttime=starttime, rung="base", launched_wall=1.5, log=LogPosition(7, 99))


def test_our_live_server_is_adopted(spawn: SpawnFn, marker: str) -> None:
    child = spawn(SLEEP)
    starttime = starttime_of(child.pid)
    assert starttime is not None
    assert refusal(record_of(child.pid, starttime), marker) is None


def test_the_same_pid_with_another_start_time_is_refused(spawn: SpawnFn, marker: str) -> None:
    child = spawn(SLEEP)
    starttime = starttime_of(child.pid)
    assert starttime is not None
    why = refusal(record_of(child.pid, starttime + 1), marker)
    assert why is not None and "another process" in why


def test_pid_and_start_time_without_our_marker_are_refused(spawn: SpawnFn, marker: str) -> None:
    child = spawn(SLEEP, other_marker="someone-else")
    starttime = starttime_of(child.pid)
    assert starttime is not None
    why = refusal(record_of(child.pid, starttime), marker)
    assert why is not None and "marker" in why


def test_a_stranger_with_no_marker_at_all_is_refused(marker: str) -> None:
    stranger = subprocess.Popen(SLEEP)
    try:
        starttime = starttime_of(stranger.pid)
        assert starttime is not None
        why = refusal(record_of(stranger.pid, starttime), marker)
        assert why is not None and "marker" in why
    finally:
        stranger.kill()
        stranger.wait(5)


def test_a_gone_or_exited_server_is_refused(spawn: SpawnFn, marker: str) -> None:
    child = spawn(SLEEP)  # alive until killed: a child that exits at once may be a zombie already (loaded CI)
    starttime = starttime_of(child.pid)
    assert starttime is not None
    os.kill(child.pid, 9)
    child._popen.wait(10)  # reaped: gone
    why = refusal(record_of(child.pid, starttime), marker)
    assert why is not None and "gone" in why


def test_an_adopted_child_ends_once_and_for_all(spawn: SpawnFn) -> None:
    child = spawn(SLEEP)
    starttime = starttime_of(child.pid)
    assert starttime is not None
    adopted = AdoptedChild(child.pid, starttime)
    assert adopted.poll() is None
    os.kill(child.pid, 9)
    child._popen.wait(10)
    assert adopted.poll() == EXIT_UNKNOWN
    assert AdoptedChild(os.getpid(), starttime).poll() == EXIT_UNKNOWN  # a live pid, not our start time


@pytest.mark.parametrize(
    "server",
    [
        None,
        "x",
        {"pid": "12", "starttime": 5, "rung": "base", "launched_wall": 1.0},
        {"pid": 12, "starttime": -5, "rung": "base", "launched_wall": 1.0},
        {"pid": 1, "starttime": 5, "rung": "base", "launched_wall": 1.0},
        {"pid": True, "starttime": 5, "rung": "base", "launched_wall": 1.0},
        {"pid": 12, "starttime": 5, "rung": "", "launched_wall": 1.0},
        {"pid": 12, "starttime": 5, "rung": "base", "launched_wall": "now"},
        {"pid": 12, "starttime": 5, "rung": "base"},
    ],
)
def test_a_malformed_server_record_is_not_adopted(tmp_path: Path, server: object) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"version": 1, "marker": "m", "rungs": ["base"], "current": "base", "server": server}))
    saved, _ = load(path, ("base",))
    assert saved is not None and saved.server is None


def test_the_record_survives_a_save_and_load(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    record = record_of(1234, 5678)
    save(path, Persisted("m", LadderState(), ("base",), server=record))
    saved, _ = load(path, ("base",))
    assert saved is not None and saved.server == record
    save(path, Persisted("m", LadderState(), ("base",), server=ServerRecord(1234, 5678, "base", 2.0, None)))
    saved, _ = load(path, ("base",))
    assert saved is not None and saved.server is not None and saved.server.log is None


def test_the_stopped_flag_round_trips_and_must_be_a_boolean(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    save(path, Persisted("m", LadderState(), ("base",), stopped=True))
    saved, _ = load(path, ("base",))
    assert saved is not None and saved.stopped is True
    path.write_text(json.dumps({"version": 1, "marker": "m", "stopped": "yes"}))
    saved, why = load(path, ("base",))
    assert saved is None and "stopped" in why
