"""Issue 50: state files read as untrusted input (supervisor/common/statefiles.py): a FIFO, a link
or a device is refused at once (a FIFO had hung the daemon's start), and a launch-book entry with a
number that is not one (NaN had turned the learned stall window off) is dropped, said why."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from supervisor.common.statefiles import MAX_SECONDS, book_entries, read_regular
from supervisor.config.fast import LearnedSettings
from supervisor.policy.learned import Learned, window_for
from supervisor.warmstart.timeline import LaunchBook


def test_a_regular_file_is_read_and_nothing_else_is(tmp_path: Path) -> None:
    good = tmp_path / "state.json"
    good.write_bytes(b'{"a": 1}')
    assert read_regular(good) == b'{"a": 1}'
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing.json")
    link = tmp_path / "link.json"
    link.symlink_to(good)
    with pytest.raises(OSError, match="symbolic link"):
        read_regular(link)
    with pytest.raises(OSError, match="not a regular file"):
        read_regular(tmp_path)
    with pytest.raises(OSError, match="over 4"):
        read_regular(good, limit=4)


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "launches.json"
    os.mkfifo(fifo)
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(read_regular(fifo))
        except OSError as err:
            outcome.append(err)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the read of a FIFO waited for a writer"
    assert isinstance(outcome[0], OSError) and "not a regular file" in str(outcome[0])


def entry(**quiet: object) -> dict[str, object]:
    return {"host": "h", "model": "/m", "rung": "base", "fingerprint": "f", "starts": 3, "quiet_s": quiet}


@pytest.mark.parametrize(
    "bad,why",
    [
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (-1.0, "-1"),
        (MAX_SECONDS * 2, "not a number in"),
        (True, "not a number"),
        ("12", "not a number"),
        (None, "not a number"),
    ],
)
def test_an_entry_with_a_number_that_is_not_one_is_dropped_and_said_why(bad: object, why: str) -> None:
    kept, dropped = book_entries({"good": entry(spawning=3.5), "bad": entry(spawning=2.0, weights=bad)})
    assert list(kept) == ["good"]
    (line,) = dropped
    assert line.startswith("entry 'bad' dropped: quiet_s['weights']") and why in line, line


def test_the_last_good_launch_and_the_start_count_are_checked_too() -> None:
    base = entry(spawning=1.0)
    cases = [
        {**base, "starts": -1},
        {**base, "starts": 2.5},
        {**base, "last_good": {"offsets": {"ready": float("nan")}, "time_to_ready_s": 9.0, "wall": 1e9}},
        {**base, "last_good": {"offsets": {}, "time_to_ready_s": float("inf"), "wall": 1e9}},
        {**base, "last_good": {"offsets": {}, "time_to_ready_s": 9.0, "wall": -5}},
        {**base, "quiet_s": [1.0]},
    ]
    kept, dropped = book_entries({str(i): c for i, c in enumerate(cases)})
    assert kept == {} and len(dropped) == len(cases), dropped
    assert book_entries([1, 2]) == ({}, ("entries is not a record: every entry dropped",))


def test_nan_written_into_launches_json_leaves_the_configured_window(tmp_path: Path) -> None:
    path = tmp_path / "launches.json"
    doc = {"version": 1, "entries": {"k": entry(waiting=float("nan"))}}
    path.write_text(json.dumps(doc))  # json writes NaN as the bare word the issue put there
    assert "NaN" in path.read_text()
    book = LaunchBook(path).load()
    assert book.entries == {} and "quiet_s['waiting'] is nan" in (book.load_error or "")


@pytest.mark.parametrize("quiet", [float("nan"), float("inf"), -3.0])
def test_a_learned_window_is_never_longer_than_configured_nor_shorter_than_the_floor(quiet: float) -> None:
    s = LearnedSettings(floor_s=20.0, multiple=5.0, min_starts=1)
    w = window_for(Learned(starts=5, quiet_s={"waiting": quiet}), "waiting", 180.0, s)
    assert w.window_s == 180.0 and w.source == "configured", w
    for q in (0.0, 1.0, 10.0, 30.0, 1e9):
        w = window_for(Learned(starts=5, quiet_s={"waiting": q}), "waiting", 180.0, s)
        assert 20.0 <= w.window_s <= 180.0, (q, w)
