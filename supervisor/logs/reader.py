"""Follows the server's log files into an in-memory ring of lines, from a position that survives restarts.

The server writes to a pipe held by the log keeper (`supervisor.logs.keeper`), which writes
`state_dir/logs/server.log` and rotates it to server.log.1 ... server.log.N. This module reads those
files: a thread follows the current file from a `LogPosition` (inode and byte offset), and when the
keeper rotates it reads the renamed file to its end, then continues in its successor, found by
inode, so no line is skipped while at most `backups` rotations separate reader and writer. The
position of the last complete line is saved in state.json, so a restarted daemon resumes where the
last one stopped (a line may be read twice, never lost).

Memory is bounded: reads of 64 KiB, a partial line flushed as a line once it reaches
`max_partial_bytes`, lines cut at `max_line_chars`, and a ring of `memory_lines`. Lines are kept
as raw bytes and decoded only when asked for, so a flood of hundreds of MB costs little CPU.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from probes.types import LogLine
from supervisor.logs.keeper import read_stats, stats_path

StreamName = Literal["stdout", "stderr"]
# One pipe carries both streams (as a terminal shows them); SGLang's logging, tqdm bars and
# tracebacks all go to stderr, so that is the label the log probe sees.
STREAM: StreamName = "stderr"

READ_SIZE = 65536
_CR, _LF = 0x0D, 0x0A


@dataclass(frozen=True)
class LogPosition:
    """Where reading stopped: the file's inode and the offset just past the last complete line."""

    inode: int
    offset: int


@dataclass(frozen=True)
class LogStats:
    lines: int  # lines seen since the launch (CR updates count)
    bytes: int  # bytes read from the files
    dropped_from_memory: int  # lines no longer (or never) in the ring
    truncated_lines: int  # lines longer than max_line_chars
    files_skipped: int  # times the reader fell more than `backups` rotations behind: lines may be missing
    write_errors: int = 0  # writes of the log file the keeper could not make (disk full, ...)
    last_write_error: str = ""


class _Splitter:
    """Splits a byte stream on \\n, \\r\\n and lone \\r, holding back at most one partial line."""

    def __init__(self, max_partial: int) -> None:
        self._max_partial = max_partial
        self._buf = b""
        self._after_cr = False  # the last chunk ended in \r: a leading \n completes that \r\n

    def feed(self, chunk: bytes) -> tuple[list[bytes], bytes]:
        """The complete lines in `chunk`, and the raw bytes they span (for the file)."""
        lead = b""
        if self._after_cr and chunk[:1] == b"\n":
            lead, chunk = b"\n", chunk[1:]
        self._after_cr = False
        data = self._buf + chunk if self._buf else chunk
        if not data:
            return [], lead
        lines = data.splitlines()  # bytes.splitlines splits on exactly \n, \r\n and \r
        if data[-1] in (_CR, _LF):
            self._buf = b""
            self._after_cr = data[-1] == _CR
            return lines, lead + data
        self._buf = lines.pop()
        if len(self._buf) >= self._max_partial:  # bounded: a huge unterminated line comes in pieces
            lines.append(self._buf)
            self._buf = b""
            return lines, lead + data
        return lines, lead + data[: len(data) - len(self._buf)]

    def flush(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest

    @property
    def pending(self) -> int:
        """Bytes of a partial line held back."""
        return len(self._buf)


# A line in the ring: (seq, at, stream, first max_line_chars bytes, bytes cut off).
_Entry = tuple[int, float, StreamName, bytes, int]


class LogCapture:
    """Follows one launch's (or one adopted server's) log from `start`; `close` stops it."""

    def __init__(
        self,
        log_dir: Path,
        *,
        memory_lines: int,
        start: LogPosition | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        max_line_chars: int = 4096,
        max_partial_bytes: int = 64 * 1024,
        file_name: str = "server.log",
        poll_s: float = 0.05,
        idle_poll_s: float = 0.25,
    ) -> None:
        self._path = log_dir / file_name
        self._start = start
        self._monotonic = monotonic
        self._max_chars = max_line_chars
        self._splitter = _Splitter(max_partial_bytes)
        self._poll_s = poll_s
        # A quiet log is looked at less and less often, down to this (issue 51: at a steady 50 ms the
        # idle thread alone cost 0.2 % of a core, a third of the daemon); the next line read brings
        # the short poll back.
        self._idle_poll_s = max(poll_s, idle_poll_s)
        self._ring: collections.deque[_Entry] = collections.deque(maxlen=memory_lines)
        self._lock = threading.Lock()  # the ring, the counters and the position
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._inode = 0
        self._offset = 0  # of the next byte to read in the current file
        self._position: LogPosition | None = start
        self._seq = 0
        self._bytes = 0
        self._dropped = 0
        self._truncated = 0
        self._skipped = 0

    @staticmethod
    def end_of(log_dir: Path, file_name: str = "server.log") -> LogPosition | None:
        """The current end of the log: where a new launch's lines will begin (None: no file yet)."""
        try:
            st = os.stat(log_dir / file_name)
        except OSError:
            return None
        return LogPosition(st.st_ino, st.st_size)

    def start(self) -> LogCapture:
        self._thread = threading.Thread(target=self._follow, name="logcapture", daemon=True)
        self._thread.start()
        return self

    @property
    def start_position(self) -> LogPosition | None:
        """Where this launch's lines begin (journalled with `server_launched`: `logs --previous`)."""
        return self._start

    @property
    def position(self) -> LogPosition | None:
        """Just past the last complete line read: what a restarted daemon resumes from."""
        with self._lock:
            return self._position

    # ---- the reader thread -------------------------------------------------------------------

    def _follow(self) -> None:
        try:
            wait = self._poll_s
            while not self._stop.is_set():
                if self._fd is None and not self._open_first():
                    self._stop.wait(self._poll_s)
                    continue
                if self._read_available():
                    wait = self._poll_s
                    continue
                if self._next_file():
                    wait = self._poll_s
                else:
                    self._stop.wait(wait)
                    wait = min(2 * wait, self._idle_poll_s)
            if self._fd is not None or self._open_first():
                while self._read_available() or self._next_file():  # what was written before the stop
                    pass
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _chain(self) -> list[tuple[Path, int]]:
        """The log's files, oldest first, with their inodes: two equal listings in a row, so a
        listing taken while the keeper renames files one by one is not trusted."""
        last = self._list()
        for _ in range(10):
            now = self._list()
            if now == last:
                break
            last = now
        return last

    def _list(self) -> list[tuple[Path, int]]:
        name = str(self._path)
        found: list[tuple[Path, int]] = []
        backups = sorted(
            (
                int(p.name.rsplit(".", 1)[1])
                for p in self._path.parent.glob(self._path.name + ".*")
                if p.name.rsplit(".", 1)[1].isdigit()
            ),
            reverse=True,
        )
        for path in [Path(f"{name}.{i}") for i in backups] + [self._path]:
            with contextlib.suppress(OSError):
                found.append((path, os.stat(path).st_ino))
        return found

    def _open_first(self) -> bool:
        chain = self._chain()
        if not chain:
            return False
        start = self._start
        for path, inode in chain:
            if start is not None and inode == start.inode:
                return self._open(path, inode, start.offset)
        if start is not None:
            self._skipped += 1  # the file we were in was rotated away and deleted meanwhile
        return self._open(*chain[0], 0)

    def _open(self, path: Path, inode: int, offset: int) -> bool:
        """Open `path` if it is still the file `inode` (the keeper may rename it under us)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return False
        st = os.fstat(fd)
        if st.st_ino != inode:
            os.close(fd)
            return False
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._inode, self._offset = fd, st.st_ino, min(offset, st.st_size)
        os.lseek(fd, self._offset, os.SEEK_SET)
        return True

    def _read_available(self) -> bool:
        """Read one chunk of the current file; False at its end."""
        assert self._fd is not None
        try:
            chunk = os.read(self._fd, READ_SIZE)
        except OSError:
            return False
        if not chunk:
            return False
        self._offset += len(chunk)
        lines, _ = self._splitter.feed(chunk)
        self._ingest(lines, len(chunk))
        return True

    def _next_file(self) -> bool:
        """At the end of a file the keeper has rotated away: move to its successor. False if none."""
        try:
            if os.stat(self._path).st_ino == self._inode:
                return False  # still the current file: wait for more (one stat per idle poll)
        except OSError:
            return False  # mid-rotation: the keeper creates the new file at once
        if self._read_available():  # written just before the rotation
            return True
        chain = self._chain()
        inodes = [inode for _, inode in chain]
        if self._inode in inodes:
            successor = chain[inodes.index(self._inode) + 1]
        else:  # ours was deleted after we opened it: continue with the oldest file still there
            successor = chain[0]
            self._skipped += len(chain) > 1  # with backups, whole files may have gone unread
        return self._open(*successor, 0)  # False when renamed meanwhile: look again after a poll

    def _ingest(self, lines: list[bytes], nbytes: int) -> None:
        at = self._monotonic()
        limit = self._max_chars
        truncated = sum(1 for raw in lines if len(raw) > limit)
        with self._lock:
            self._bytes += nbytes
            self._truncated += truncated
            self._position = LogPosition(self._inode, self._offset - self._splitter.pending)
            maxlen = self._ring.maxlen or 0
            keep = lines[-maxlen:] if len(lines) > maxlen else lines
            first = self._seq + 1 + len(lines) - len(keep)
            self._dropped += len(lines) - len(keep) + max(0, len(self._ring) + len(keep) - maxlen)
            self._seq += len(lines)
            self._ring.extend(
                (seq, at, STREAM, raw[:limit], max(0, len(raw) - limit))
                for seq, raw in zip(itertools.count(first), keep)
            )

    # ---- what the supervisor reads -------------------------------------------------------------

    def lines_since(self, seq: int) -> list[LogLine]:
        """Lines with a sequence number above `seq` still in memory, oldest first."""
        with self._lock:
            if not self._ring:
                return []
            start = max(0, seq - self._ring[0][0] + 1)
            entries = list(itertools.islice(self._ring, start, None)) if start < len(self._ring) else []
        return [LogLine(seq=e[0], at=e[1], stream=e[2], text=_text(e)) for e in entries]

    @property
    def latest_seq(self) -> int:
        with self._lock:
            return self._seq

    def tail(self, n: int) -> list[str]:
        if n <= 0:
            return []
        with self._lock:
            entries = list(itertools.islice(self._ring, max(0, len(self._ring) - n), None))
        return [_text(e) for e in entries]

    @property
    def stats(self) -> LogStats:
        write_errors, last_error = read_stats(stats_path(self._path.parent, self._path.name))
        with self._lock:
            return LogStats(
                lines=self._seq,
                bytes=self._bytes,
                dropped_from_memory=self._dropped,
                truncated_lines=self._truncated,
                files_skipped=self._skipped,
                write_errors=write_errors,
                last_write_error=last_error,
            )

    def close(self, timeout: float = 2.0) -> None:
        """Read what the files hold now (the server's last lines), then stop following."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        rest = self._splitter.flush()
        if rest:  # an unterminated last line: shown, but a successor resumes before it (it may go on)
            resume_at = self.position
            self._ingest([rest], 0)
            with self._lock:
                self._position = resume_at


def _text(entry: _Entry) -> str:
    text = entry[3].decode("utf-8", "replace")
    return f"{text} …[truncated {entry[4]} bytes]" if entry[4] else text
