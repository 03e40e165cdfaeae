"""Reading the end of a rotating file and following what is appended, as `tail -F` does.

Used by `GET /logs` (the server's output, which the log keeper rotates to server.log.1 ...) and
`GET /events?follow=true` (the journal, rotated to events.jsonl.1 ...). Blocking file reads: the
routes call these on the API's own thread pool (api/pool.py). A rotation is noticed by the inode
under the name changing (or the file shrinking): the old file is read to its end first, so no line
is lost across it.

Everything here is bounded in bytes whatever the lines look like (issue 33: a backward read that
re-joined a 300 MB line for every 64 KiB chunk had not answered after 240 s): a tail reads at most
TAIL_BUDGET bytes from the end, a line longer than MAX_LINE is cut (its first MAX_LINE bytes and a
note saying how long it was), and a follower reads at most READ_BUDGET per call and skips ahead,
counting what it skipped, when it has fallen more than MAX_BACKLOG behind.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO

MAX_LINE = 64 * 1024  # a line is cut beyond this (a follower holds at most this much of one)
TAIL_BUDGET = 16 * 1024 * 1024  # bytes a tail reads from the end, whatever the line lengths
READ_BUDGET = 1024 * 1024  # bytes a follower reads per call
MAX_BACKLOG = 8 * 1024 * 1024  # a follower further behind than this skips to the newest READ_BUDGET
_CHUNK = 64 * 1024
NOTE = b"[sglang-supervisor: "  # how a note of ours in a stream begins


def cut_note(length: int) -> bytes:
    return f" [sglang-supervisor: line cut, {length:,} bytes, first {MAX_LINE:,} shown]".encode()


def skip_note(skipped: int) -> bytes:
    return f"[sglang-supervisor: {skipped:,} bytes skipped: this reader fell behind]".encode()


def tail_lines(
    path: Path, n: int, backups: int = 5, *, budget: int = TAIL_BUDGET, max_line: int = MAX_LINE
) -> list[bytes]:
    """The last `n` lines of `path` and its rotated backups (`path.1` ...), oldest first, reading at
    most `budget` bytes in all; a line over `max_line` is cut and says so."""
    if n <= 0:
        return []
    newest_first: list[bytes] = []
    left = budget
    for p in (path, *(path.with_name(f"{path.name}.{i}") for i in range(1, backups + 1))):
        left -= _backwards(p, n - len(newest_first), left, max_line, newest_first)
        if len(newest_first) >= n or left <= 0:
            break
    return newest_first[::-1]


def _backwards(path: Path, want: int, budget: int, max_line: int, out: list[bytes]) -> int:
    """Append up to `want` lines of one file to `out`, last first; returns the bytes it scanned.

    Only newline positions are searched backwards (each byte once); a line is then sliced from the
    chunk in hand or read with one bounded read, so a giant line costs its first `max_line` bytes.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return 0
    with f:
        try:
            size = f.seek(0, os.SEEK_END)
        except OSError:
            return 0
        pos = end = size  # `end`: where the line being looked for ends (exclusive)
        scanned = 0
        while pos > 0 and scanned < budget and want > 0:
            step = min(_CHUNK, pos, budget - scanned)
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            scanned += step
            i = len(chunk)
            while want > 0:
                j = chunk.rfind(b"\n", 0, i)
                if j < 0:
                    break
                want -= _emit(f, pos + j + 1, end, max_line, out, chunk, pos)
                end, i = pos + j, j
        if want > 0 and end > pos:
            if pos == 0:  # the first line of the file
                _emit(f, 0, end, max_line, out, b"", 0)
            elif end - pos >= max_line:  # the budget ran out inside a giant line: its newest part
                f.seek(end - max_line)
                note = f" [sglang-supervisor: line cut, over {budget:,} bytes]".encode()
                out.append(f.read(max_line).rstrip(b"\r") + note)
        return scanned


def _emit(f: BinaryIO, start: int, end: int, max_line: int, out: list[bytes], chunk: bytes, chunk_at: int) -> int:
    """Append the line [start, end) unless it is blank; 1 if appended."""
    length = end - start
    if length <= 0:
        return 0
    if start >= chunk_at and end <= chunk_at + len(chunk) and length <= max_line:
        line = chunk[start - chunk_at : end - chunk_at]
    else:
        f.seek(start)
        line = f.read(min(length, max_line))
    line = line.rstrip(b"\r")
    if not line.strip():
        return 0
    out.append(line + cut_note(length) if length > max_line else line)
    return 1


class Follower:
    """Lines appended to `path` from now on (from its current end), across rotations.

    `skipped` counts the bytes jumped over because this reader fell more than MAX_BACKLOG behind;
    `cut` the lines cut at MAX_LINE.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: BinaryIO | None = None
        self._inode: int | None = None
        self._partial = b""  # the unfinished line's first MAX_LINE bytes
        self._partial_len = 0  # and its whole length so far
        self.skipped = 0
        self.cut = 0
        self._open(at_end=True)

    def _open(self, *, at_end: bool) -> None:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - held open across reads
        except OSError:
            return
        self._f = f
        self._inode = os.fstat(f.fileno()).st_ino
        if at_end:
            f.seek(0, os.SEEK_END)

    def read_new(self) -> list[bytes]:
        """Complete lines appended since the last call (a line still being written waits), at most
        READ_BUDGET bytes of them; a skip ahead is one note line in its place."""
        lines: list[bytes] = []
        if self._f is None:
            self._open(at_end=False)  # the file appeared after we started: all of it is new
            if self._f is None:
                return lines
        lines += self._drain()
        if self._at_end() and self._rotated():  # the old file is read to its end first
            self.close()
            self._open(at_end=False)
            if self._f is not None:
                lines += self._drain()
        return lines

    def _at_end(self) -> bool:
        assert self._f is not None
        try:
            return os.fstat(self._f.fileno()).st_size <= self._f.tell()
        except OSError:
            return True

    def _rotated(self) -> bool:
        try:
            st = self.path.stat()
        except OSError:
            return False  # gone for a moment between two renames; look again next time
        assert self._f is not None
        return st.st_ino != self._inode or st.st_size < self._f.tell()

    def _drain(self) -> list[bytes]:
        assert self._f is not None
        out: list[bytes] = []
        try:
            size = os.fstat(self._f.fileno()).st_size
        except OSError:
            return out
        behind = size - self._f.tell()
        if behind > MAX_BACKLOG:  # far behind: jump to the newest READ_BUDGET, say how much was skipped
            skip = behind - READ_BUDGET
            self._f.seek(skip, os.SEEK_CUR)
            self.skipped += skip
            self._partial, self._partial_len = b"", 0
            out.append(skip_note(skip))
            self._f.readline(MAX_LINE)  # the rest of the line the jump landed in
        data = self._f.read(READ_BUDGET)
        if not data:
            return out
        start = 0
        while True:
            j = data.find(b"\n", start)
            if j < 0:
                break
            piece = data[start:j]
            line = self._partial + piece[: max(0, MAX_LINE - len(self._partial))]
            length = self._partial_len + len(piece)
            self._partial, self._partial_len = b"", 0
            start = j + 1
            line = line.rstrip(b"\r")
            if not line.strip():
                continue
            if length > MAX_LINE:
                self.cut += 1
                line += cut_note(length)
            out.append(line)
        rest = data[start:]
        self._partial += rest[: max(0, MAX_LINE - len(self._partial))]
        self._partial_len += len(rest)
        return out

    def close(self) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):
                self._f.close()
        self._f = None
