"""The log keeper: holds the read end of the server's output pipe and writes it to rotating files.

`python -m supervisor.logs.keeper --dir DIR --name server.log --max-bytes N --backups K` reads its
stdin (the server's stdout and stderr, one pipe) until every writer has closed it, then exits.
It is a process of its own, started next to the server and not by it, so the server's output does
not depend on the daemon: a daemon that crashes, is SIGKILLed or restarts for an upgrade leaves
the keeper draining the pipe, the server never blocks on a full pipe or dies of SIGPIPE, and no
line is lost while the daemon is away. The daemon reads the files (`supervisor.logs.reader`).

It ignores SIGTERM, SIGINT and SIGHUP: a stop of the server tree, a Ctrl-C or a closed terminal
must not cut off the server's last lines; it ends at EOF, when the last writer is gone. Growth is
bounded by `(backups + 1) * max_bytes`. It imports nothing beyond the standard library, so it
starts in tens of milliseconds and holds a few MB.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

READ_SIZE = 65536
PIPE_SIZE = 1 << 20  # fewer wake-ups for a fast writer; the kernel may refuse, which is fine
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_ERROR_REPORT_S = 60.0  # a full disk is reported once a minute on stderr, not once per write


class RotatingFile:
    """`path`, rotated to path.1 ... path.N so that no file grows past `max_bytes`.

    A write that does not fit is split at the last line break that does, so files hold whole
    lines unless a single line is longer than the cap. Rotation renames: a reader holding the old
    file open keeps reading it to its end, then finds its successor by inode.
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


STATS_SIZE = 256


def stats_path(log_dir: Path, name: str) -> Path:
    return log_dir / f".{name}.keeper"


class StatsFile:
    """The keeper's failed writes, for the daemon: a fixed-size file rewritten in place.

    Created (and its blocks allocated) at start, so recording a failure needs no new disk space,
    which is exactly what a full disk lacks. Line: `<failed writes> <last error>`, space-padded.
    """

    def __init__(self, path: Path) -> None:
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o640)
            self.record(0, "")

    def record(self, failures: int, error: str) -> None:
        if self._fd is None:
            return
        line = f"{failures} {error}".encode()[: STATS_SIZE - 1]
        with contextlib.suppress(OSError):
            os.pwrite(self._fd, line.ljust(STATS_SIZE - 1) + b"\n", 0)


def read_stats(path: Path) -> tuple[int, str]:
    """(failed writes, last error) the keeper recorded; (0, "") when it recorded none."""
    try:
        count, _, error = path.read_text(errors="replace").strip().partition(" ")
        return int(count), error.strip()
    except (OSError, ValueError):
        return 0, ""


def keep(
    fd: int,
    out: RotatingFile,
    err: IO[str],
    stats: StatsFile | None = None,
    copy: Callable[[bytes], None] | None = None,
) -> tuple[int, int]:
    """Copy `fd` to `out` until EOF; returns (bytes read, failed writes). Never stops reading on a write error."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)
    total = failures = 0
    reported_at = -_ERROR_REPORT_S
    while True:
        try:
            chunk = os.read(fd, READ_SIZE)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        total += len(chunk)
        if copy is not None:  # the journal (supervisor.logs.journald): never blocks, never raises
            copy(chunk)
        try:
            out.write(chunk)
        except OSError as e:  # disk full, read-only, directory gone: the pipe keeps draining
            failures += 1
            if stats is not None:
                stats.record(failures, f"{type(e).__name__}: {e}")
            now = time.monotonic()
            if now - reported_at >= _ERROR_REPORT_S:
                reported_at = now
                with contextlib.suppress(OSError, ValueError):
                    print(f"sglang-supervisor log keeper: cannot write the server log: {e}", file=err, flush=True)
    out.close()
    return total, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m supervisor.logs.keeper")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--name", default="server.log")
    parser.add_argument("--max-bytes", required=True, type=int)
    parser.add_argument("--backups", required=True, type=int)
    parser.add_argument("--journal-socket", help="also send each line to journald's native socket")
    parser.add_argument("--journal-id", default="sglang", help="SYSLOG_IDENTIFIER of those lines")
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    out = RotatingFile(args.dir / args.name, max(1, args.max_bytes), max(0, args.backups))
    sender = None
    if args.journal_socket:
        from supervisor.logs.journald import JournalSender

        sender = JournalSender(args.journal_socket, args.journal_id)
    keep(0, out, sys.stderr, StatsFile(stats_path(args.dir, args.name)), sender.write if sender else None)
    if sender is not None:
        sender.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
