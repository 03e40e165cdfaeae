"""tail -F for the streamed routes: the end of a rotating file, and what is appended across rotations."""

from __future__ import annotations

import os
from pathlib import Path

from api.follow import Follower, tail_lines


def test_tail_reads_back_across_rotated_files(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    (tmp_path / "server.log.2").write_bytes(b"a\nb\n")
    (tmp_path / "server.log.1").write_bytes(b"c\r\nd\n")
    log.write_bytes(b"e\n\nf\npartial")
    assert tail_lines(log, 3) == [b"e", b"f", b"partial"]
    assert tail_lines(log, 100) == [b"a", b"b", b"c", b"d", b"e", b"f", b"partial"]
    assert tail_lines(log, 0) == [] and tail_lines(tmp_path / "none", 5) == []


def test_follower_sends_whole_lines_and_loses_none_over_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"old\n")
    f = Follower(log)
    assert f.read_new() == []  # starts at the end
    with open(log, "ab") as w:
        w.write(b"one\ntw")
    assert f.read_new() == [b"one"]  # a line still being written waits
    with open(log, "ab") as w:
        w.write(b"o\nlast of the old file\n")
    os.replace(log, tmp_path / "server.log.1")  # the keeper rotates
    log.write_bytes(b"first of the new file\n")
    assert f.read_new() == [b"two", b"last of the old file", b"first of the new file"]
    log.write_bytes(b"")  # truncated in place
    with open(log, "ab") as w:
        w.write(b"after truncation\n")
    assert f.read_new() == [b"after truncation"]
    f.close()


def test_a_file_that_appears_later_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    f = Follower(log)
    assert f.read_new() == []
    log.write_bytes(b'{"event": "x"}\n')
    assert f.read_new() == [b'{"event": "x"}']
    f.close()


def test_a_giant_line_is_cut_and_the_tail_reads_a_bounded_number_of_bytes(tmp_path: Path) -> None:
    from api import follow

    log = tmp_path / "server.log"
    with open(log, "wb") as w:
        w.write(b"before\n")
        w.write(b"x" * (3 * follow.MAX_LINE) + b"\n")
        w.write(b"after\n")
    got = tail_lines(log, 10)
    assert got[0] == b"before" and got[2] == b"after"
    assert got[1].startswith(b"x" * follow.MAX_LINE) and b"line cut, 196,608 bytes" in got[1]
    assert len(got[1]) < follow.MAX_LINE + 100
    # One line bigger than the whole budget: its newest MAX_LINE bytes, said to be cut; nothing older.
    log.write_bytes(b"old\n" + b"y" * 300_000)
    got = tail_lines(log, 5, budget=200_000)
    assert len(got) == 1 and got[0].startswith(b"y" * 1000) and b"line cut, over 200,000 bytes" in got[0]


def test_a_follower_cuts_giant_lines_and_skips_ahead_when_far_behind(tmp_path: Path) -> None:
    from api import follow

    log = tmp_path / "server.log"
    log.write_bytes(b"")
    f = Follower(log)
    with open(log, "ab") as w:
        w.write(b"z" * (2 * follow.MAX_LINE))
    assert f.read_new() == []  # unfinished, and only its first MAX_LINE bytes are held
    with open(log, "ab") as w:
        w.write(b"zz\nshort\n")
    cut, short = f.read_new()
    assert short == b"short" and len(cut) < follow.MAX_LINE + 100 and b"line cut, 131,074 bytes" in cut
    assert f.cut == 1
    flood = b"".join(b"line %07d\n" % i for i in range(1_000_000))  # 13 MB: more than MAX_BACKLOG behind
    with open(log, "ab") as w:
        w.write(flood)
    first = f.read_new()
    assert first[0].startswith(follow.NOTE) and b"skipped" in first[0]
    assert 0 < f.skipped <= len(flood) - follow.READ_BUDGET + follow.MAX_LINE
    assert sum(len(x) + 1 for x in first[1:]) <= follow.READ_BUDGET
    rest: list[bytes] = []
    while batch := f.read_new():
        rest += batch
    assert (first[1:] + rest)[-1] == b"line 0999999", "after the skip it reads on to the end"
    f.close()
