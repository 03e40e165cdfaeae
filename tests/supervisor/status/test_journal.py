"""The journal: one JSON line per event, rotated, never raising, read back despite damage."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from supervisor.status.journal import Journal


class Wall:
    def __init__(self, now: float = 1_735_689_600.0) -> None:
        self.now = now

    def __call__(self) -> float:
        self.now += 1.5
        return self.now


def test_append_writes_one_json_line(tmp_path: Path) -> None:
    path = tmp_path / "state" / "events.jsonl"
    j = Journal(path, wall=Wall())
    j.append("state_changed", old="starting", new="ready", rung="base", pid=42)
    j.append("incident", cause="startup_stall", hang_class=None, detail="no progress for 180 s")
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first == {
        "ts": "2025-01-01T00:00:01.500Z",
        "event": "state_changed",
        "old": "starting",
        "new": "ready",
        "rung": "base",
        "pid": 42,
    }
    assert list(first)[:2] == ["ts", "event"]
    assert j.read(10)[1]["hang_class"] is None


def test_fields_cannot_override_ts_and_odd_values_still_serialise(tmp_path: Path) -> None:
    j = Journal(tmp_path / "e.jsonl", wall=Wall())
    j.append("x", ts="forged", path=Path("/tmp/a"), ratio=math.nan, big=math.inf, nested={"v": -math.inf}, t=(1, 2))
    (record,) = j.read(5)
    assert record["ts"] != "forged"
    assert record["path"] == "/tmp/a"
    assert record["ratio"] == "nan"
    assert record["big"] == "inf"
    assert record["nested"] == {"v": "-inf"}
    assert record["t"] == [1, 2]
    assert j.write_errors == 0


def test_read_is_newest_last_and_limited(tmp_path: Path) -> None:
    j = Journal(tmp_path / "e.jsonl")
    for i in range(50):
        j.append("tick", n=i)
    assert [r["n"] for r in j.read(5)] == [45, 46, 47, 48, 49]
    assert len(j.read(1000)) == 50
    assert j.read(0) == []
    assert Journal(tmp_path / "absent.jsonl").read(10) == []


def test_torn_last_line_and_garbage_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    j = Journal(path)
    j.append("a")
    with open(path, "ab") as f:
        f.write(b"not json at all\n\xff\xfe binary\n[1, 2]\n\n")
    j.append("b")
    with open(path, "ab") as f:
        f.write(b'{"ts": "2025", "event": "torn')  # a crash mid-write
    assert [r["event"] for r in j.read(10)] == ["a", "b"]


def test_rotation_keeps_backups_and_reads_across_them(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    j = Journal(path, max_bytes=400, backups=2)
    for i in range(40):
        j.append("tick", n=i, pad="x" * 20)
    assert path.stat().st_size <= 400
    assert (tmp_path / "e.jsonl.1").exists()
    assert (tmp_path / "e.jsonl.2").exists()
    assert not (tmp_path / "e.jsonl.3").exists()
    got = [r["n"] for r in j.read(1000)]
    assert got == sorted(got)
    assert got[-1] == 39
    assert len(got) > 10  # more than the current file holds: the backups were read too
    assert [r["n"] for r in j.read(3)] == [37, 38, 39]


def test_no_backups_truncates(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    j = Journal(path, max_bytes=200, backups=0)
    for i in range(30):
        j.append("tick", n=i)
    assert path.stat().st_size <= 200
    assert not (tmp_path / "e.jsonl.1").exists()
    assert j.read(100)[-1]["n"] == 29


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions")
def test_write_errors_are_counted_not_raised_readonly(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    os.chmod(d, 0o500)
    j = Journal(d / "e.jsonl")
    j.append("x")
    assert j.write_errors == 1


def test_write_errors_are_counted_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    j = Journal(blocker / "sub" / "e.jsonl")  # a parent that is a file: every write fails
    j.append("x")
    j.append("y", v=object())
    assert j.write_errors == 2
    assert j.read(5) == []


def test_a_directory_in_the_way_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.mkdir()
    j = Journal(path)
    j.append("x")
    assert j.write_errors == 1
    assert j.read(5) == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(fields=st.dictionaries(st.text(min_size=1, max_size=10).filter(lambda k: k != "event"), json_values))
@example(fields={"self": "a field named like append's own parameter"})
@settings(max_examples=100, deadline=None)
def test_any_fields_round_trip_as_one_line(tmp_path_factory: pytest.TempPathFactory, fields: dict[str, object]) -> None:
    path = tmp_path_factory.mktemp("j") / "e.jsonl"
    j = Journal(path)
    j.append("fuzz", **fields)
    assert j.write_errors == 0
    assert len(path.read_bytes().splitlines()) == 1
    (record,) = j.read(5)
    assert record["event"] == "fuzz"


@given(data=st.binary(max_size=2000))
@settings(max_examples=100, deadline=None)
def test_read_survives_any_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("j") / "e.jsonl"
    path.write_bytes(data)
    j = Journal(path)
    records = j.read(1000)
    assert all(isinstance(r, dict) for r in records)
    j.append("after")
    assert j.read(1)[-1]["event"] == "after"  # a torn last line does not swallow the next record


def test_a_line_is_written_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import supervisor.status.journal as journal_module

    j = Journal(tmp_path / "events.jsonl")
    j.append("before")
    good = (tmp_path / "events.jsonl").read_bytes()
    real = os.write

    def disk_full(fd: int, data: object) -> int:
        view = memoryview(data)  # type: ignore[arg-type]
        if len(view) > 20:
            return real(fd, view[:20])  # a short write, then nothing more fits
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_module.os, "write", disk_full)
    j.append("lost", payload="x" * 200)
    monkeypatch.undo()
    assert (tmp_path / "events.jsonl").read_bytes() == good, "the partial line was cut back off"
    assert j.write_errors == 1
    j.append("after")
    assert [r["event"] for r in j.read(10)] == ["before", "after"]


def test_a_flood_of_refused_logins_rotates_no_incident_or_launch_out(tmp_path: Path) -> None:
    """Issue 50: 475,701 refused logins rotated the incident and launch records out of the journal.
    High-volume kinds go to their own file with its own rotation; `read` merges both by time."""
    clock = iter(float(t) for t in range(1_000_000_000, 1_000_100_000))
    journal = Journal(
        tmp_path / "events.jsonl", max_bytes=4096, backups=1, apart_max_bytes=4096, wall=lambda: next(clock)
    )
    journal.append("server_launched", pid=1)
    journal.append("incident", cause="startup_stall")
    for i in range(5000):
        journal.append("page_login_refused", client=f"10.0.0.{i % 250}", count=1, throttled=0)
    journal.append("server_launched", pid=2)
    assert [r["event"] for r in journal.read(10, lambda r: r["event"] != "page_login_refused")] == [
        "server_launched",
        "incident",
        "server_launched",
    ]
    assert not (tmp_path / "events.jsonl.1").exists(), "the main file was never rotated"
    assert (tmp_path / "events.access.jsonl.1").exists()
    merged = journal.read(3)
    assert [r["event"] for r in merged] == ["page_login_refused", "page_login_refused", "server_launched"]
    assert [r["ts"] for r in merged] == sorted(str(r["ts"]) for r in merged)
