"""api/logview.py: the tail `logs` and the page show (the daemon's polls hidden, each launch marked),
against real files: positions, rotation, and a tail equal to api/follow.py's when nothing is hidden."""

from __future__ import annotations

import os
from pathlib import Path

from api.follow import tail_lines
from api.logview import Launch, launch_of, marked_tail, probe_filter

POLL = b'[2026-12-07 17:16:53] INFO:     127.0.0.1:37238 - "GET /health HTTP/1.1" 200 OK'
USER = b'[2026-12-07 17:16:53] INFO:     10.0.0.7:5555 - "POST /generate HTTP/1.1" 200 OK'
KEEP = probe_filter(frozenset({"/health", "/metrics"}), show_all=False)


def launch(log: Path, rung: str, pid: int) -> Launch:
    """A launch beginning at the file's end now, as the daemon journals it."""
    at = log.stat().st_size if log.exists() else 0
    inode = log.stat().st_ino if log.exists() else None
    return Launch(inode=inode, offset=at, rung=rung, pid=pid, at=f"t{pid}")


def append(log: Path, *lines: bytes) -> None:
    with open(log, "ab") as f:
        f.write(b"".join(x + b"\n" for x in lines))


def test_polls_hidden_launches_marked_before_their_first_line(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    first = launch(log, "base", 10)
    append(log, b"loading", POLL, b"OOM: crashed")
    second = launch(log, "no-graph", 11)
    append(log, b"fired up", POLL, USER, POLL)
    got = marked_tail(log, 100, [first, second], KEEP)
    assert got == [first.separator(), b"loading", b"OOM: crashed", second.separator(), b"fired up", USER]
    assert second.separator() == b"=== sglang-supervisor: launch of rung no-graph, pid 11, at t11 ==="
    # the last 2 kept lines: only the launch that begins among them is marked
    assert marked_tail(log, 2, [first, second], KEEP) == [second.separator(), b"fired up", USER]
    everything = marked_tail(log, 100, [first, second], probe_filter(frozenset(), show_all=True))
    assert everything.count(POLL) == 3


def test_a_launch_in_a_rotated_file_and_one_with_no_output_yet(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    append(log, b"old")
    first = launch(log, "base", 10)
    append(log, b"base line")
    os.rename(log, tmp_path / "server.log.1")  # the keeper rotates by renaming
    append(log, b"more base")
    second = launch(log, "base", 12)
    assert marked_tail(log, 100, [first, second], KEEP) == [
        b"old",
        first.separator(),
        b"base line",
        b"more base",
        second.separator(),
    ]


def test_the_tail_is_follows_tail_when_nothing_is_hidden(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"a\n\nb\r\n" + b"y" * 200_000 + b"\nc")
    assert marked_tail(log, 10, [], lambda line: True) == tail_lines(log, 10)


def test_only_launch_records_with_their_position_become_launches() -> None:
    rec = {"event": "server_launched", "rung": "base", "pid": 7, "ts": "T", "log_start": {"inode": 5, "offset": 9}}
    assert launch_of(rec) == Launch(5, 9, "base", 7, "T")
    assert launch_of({**rec, "log_start": None}) == Launch(None, 0, "base", 7, "T")
    assert launch_of({"event": "incident"}) is None
