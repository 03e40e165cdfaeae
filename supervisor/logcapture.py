"""Drains the server's stdout and stderr into size-capped rotating files and an in-memory ring.

The pipes are read continuously by one thread each, so the server never blocks on a full pipe,
whatever it writes and whatever happens to the disk. Memory is bounded: reads of 64 KiB, a
partial line flushed as a line once it reaches `max_partial_bytes`, lines cut at
`max_line_chars`, and a ring of `memory_lines`. Lines are kept as raw bytes and decoded only
when asked for, so a flood of hundreds of MB costs little CPU.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from probes.types import LogLine

StreamName = Literal["stdout", "stderr"]

READ_SIZE = 65536
_PIPE_SIZE = 1 << 20  # fewer wake-ups for a fast writer; the kernel may refuse, which is fine
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_CR, _LF = 0x0D, 0x0A


@dataclass(frozen=True)
class LogStats:
    lines: int  # lines seen since the launch (CR updates count)
    bytes: int  # bytes read from the pipes
    dropped_from_memory: int  # lines no longer (or never) in the ring
    write_errors: int  # failed opens, writes or rotations of the log file
    truncated_lines: int  # lines longer than max_line_chars
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


class _RotatingFile:
    """`path`, rotated to path.1 ... path.N so that no file grows past `max_bytes`.

    A write that does not fit is split at the last line break that does, so files hold whole
    lines unless a single line is longer than the cap.
    """

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self._backups = backups
        self._file: IO[bytes] | None = None
        self._size = 0

    def write(self, data: bytes) -> None:
        if self._file is None:
            self._open()
        while data:
            room = self._max_bytes - self._size
            if len(data) <= room:
                self._write(data)
                return
            # Fill the file up to its cap, ending on a line boundary when one fits.
            cut = max(data.rfind(b"\n", 0, room), data.rfind(b"\r", 0, room)) + 1
            if cut == 0 and self._size == 0:
                cut = room  # one line longer than the cap: it has to be split
            if cut > 0:
                self._write(data[:cut])
                data = data[cut:]
            self._rotate()

    def _write(self, data: bytes) -> None:
        assert self._file is not None
        view = memoryview(data)
        try:
            while view:  # unbuffered: a disk filling up may take only part of a write
                written = self._file.write(view)
                self._size += written
                view = view[written:]
        except OSError:
            self.close()
            raise

    def _open(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self._path, "ab", buffering=0)  # noqa: SIM115 - held open across writes
        self._size = self._file.tell()

    def _rotate(self) -> None:
        self.close()
        name = str(self._path)
        if self._backups == 0:
            os.unlink(name)
        else:
            for i in range(self._backups - 1, 0, -1):
                if os.path.exists(f"{name}.{i}"):
                    os.replace(f"{name}.{i}", f"{name}.{i + 1}")
            os.replace(name, f"{name}.1")
        self._open()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


# A line in the ring: (seq, at, stream, first max_line_chars bytes, bytes cut off).
_Entry = tuple[int, float, StreamName, bytes, int]


class LogCapture:
    """Captures one launch's output. `attach` each pipe once; the capture then owns and closes it."""

    def __init__(
        self,
        log_dir: Path,
        *,
        max_file_bytes: int,
        backups: int,
        memory_lines: int,
        monotonic: Callable[[], float] = time.monotonic,
        max_line_chars: int = 4096,
        max_partial_bytes: int = 64 * 1024,
        file_name: str = "server.log",
    ) -> None:
        self._file = _RotatingFile(log_dir / file_name, max_file_bytes, backups)
        self._monotonic = monotonic
        self._max_chars = max_line_chars
        self._max_partial = max_partial_bytes
        self._ring: collections.deque[_Entry] = collections.deque(maxlen=memory_lines)
        self._lock = threading.Lock()  # the ring and the counters
        self._file_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._seq = 0
        self._bytes = 0
        self._dropped = 0
        self._truncated = 0
        self._write_errors = 0
        self._last_write_error = ""

    def attach(self, stream: IO[bytes], name: StreamName) -> None:
        thread = threading.Thread(target=self._pump, args=(stream, name), name=f"logcapture-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _pump(self, stream: IO[bytes], name: StreamName) -> None:
        splitter = _Splitter(self._max_partial)
        try:
            fd = stream.fileno()
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_SIZE)
            while chunk := _read(fd):
                lines, raw = splitter.feed(chunk)
                self._ingest(name, lines, len(chunk))
                self._write(raw)
            rest = splitter.flush()
            if rest:
                self._ingest(name, [rest], 0)
                self._write(rest)
        finally:
            stream.close()

    def _ingest(self, name: StreamName, lines: list[bytes], nbytes: int) -> None:
        at = self._monotonic()
        limit = self._max_chars
        truncated = sum(1 for raw in lines if len(raw) > limit)
        with self._lock:
            self._bytes += nbytes
            self._truncated += truncated
            maxlen = self._ring.maxlen or 0
            keep = lines[-maxlen:] if len(lines) > maxlen else lines
            first = self._seq + 1 + len(lines) - len(keep)
            self._dropped += len(lines) - len(keep) + max(0, len(self._ring) + len(keep) - maxlen)
            self._seq += len(lines)
            self._ring.extend(
                (seq, at, name, raw[:limit], max(0, len(raw) - limit)) for seq, raw in zip(itertools.count(first), keep)
            )

    def _write(self, data: bytes) -> None:
        if not data:
            return
        with self._file_lock:
            if self._closed:
                return
            try:
                self._file.write(data)
            except OSError as e:  # disk full, read-only: counted; the pipe keeps draining
                with self._lock:
                    self._write_errors += 1
                    self._last_write_error = f"{type(e).__name__}: {e}"

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
        with self._lock:
            return LogStats(
                lines=self._seq,
                bytes=self._bytes,
                dropped_from_memory=self._dropped,
                write_errors=self._write_errors,
                truncated_lines=self._truncated,
                last_write_error=self._last_write_error,
            )

    @property
    def eof(self) -> bool:
        """Every attached stream reached its end (all writers, descendants included, closed it)."""
        return bool(self._threads) and not any(t.is_alive() for t in self._threads)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every attached stream to end; True when they all did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def close(self, timeout: float = 2.0) -> None:
        """Wait up to `timeout` for the streams to end, then close the file (later output stays in memory)."""
        self.join(timeout)
        with self._file_lock:
            self._closed = True
            self._file.close()


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, READ_SIZE)
    except OSError:  # closed under us: treat as the end
        return b""


def _text(entry: _Entry) -> str:
    text = entry[3].decode("utf-8", "replace")
    return f"{text} …[truncated {entry[4]} bytes]" if entry[4] else text
