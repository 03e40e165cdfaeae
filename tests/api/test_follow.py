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
