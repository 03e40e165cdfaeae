"""Reading the end of a rotating file and following what is appended, as `tail -F` does.

Used by `GET /logs` (the server's output, which the log keeper rotates to server.log.1 ...) and
`GET /events?follow=true` (the journal, rotated to events.jsonl.1 ...). Blocking file reads: the
routes call these in worker threads. A rotation is noticed by the inode under the name changing
(or the file shrinking): the old file is read to its end first, so no line is lost across it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO

MAX_LINE = 64 * 1024  # a follower holds at most this much of an unfinished line
_CHUNK = 64 * 1024


def tail_lines(path: Path, n: int, backups: int = 5) -> list[bytes]:
    """The last `n` complete lines of `path` and its rotated backups (`path.1` ...), oldest first."""
    if n <= 0:
        return []
    newest_first: list[bytes] = []
    for p in (path, *(path.with_name(f"{path.name}.{i}") for i in range(1, backups + 1))):
        for line in _backwards(p):
            newest_first.append(line)
            if len(newest_first) >= n:
                return newest_first[::-1]
    return newest_first[::-1]


def _backwards(path: Path) -> list[bytes]:
    """The lines of one file, last first (a file that cannot be read has none)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            # Most tails are short: read from the end in chunks until enough lines are in hand.
            out: list[bytes] = []
            pos, rest = size, b""
            while pos > 0:
                step = min(_CHUNK, pos)
                pos -= step
                f.seek(pos)
                parts = (f.read(step) + rest).split(b"\n")
                rest = parts[0]
                out.extend(x.rstrip(b"\r") for x in reversed(parts[1:]) if x.strip())
                if len(out) > 10_000:
                    break
            if pos == 0 and rest.strip():
                out.append(rest.rstrip(b"\r"))
            return out
    except OSError:
        return []


class Follower:
    """Lines appended to `path` from now on (from its current end), across rotations."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: BinaryIO | None = None
        self._inode: int | None = None
        self._partial = b""
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
        """Complete lines appended since the last call (a line still being written waits)."""
        lines: list[bytes] = []
        if self._f is None:
            self._open(at_end=False)  # the file appeared after we started: all of it is new
            if self._f is None:
                return lines
        lines += self._drain()
        if self._rotated():
            self.close()
            self._open(at_end=False)
            lines += self._drain()
        return lines

    def _rotated(self) -> bool:
        try:
            st = self.path.stat()
        except OSError:
            return False  # gone for a moment between two renames; look again next time
        assert self._f is not None
        return st.st_ino != self._inode or st.st_size < self._f.tell()

    def _drain(self) -> list[bytes]:
        assert self._f is not None
        data = self._f.read()
        if not data:
            return []
        parts = (self._partial + data).split(b"\n")
        self._partial = parts.pop()[-MAX_LINE:]
        return [p.rstrip(b"\r") for p in parts if p.strip()]

    def close(self) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):
                self._f.close()
        self._f = None
