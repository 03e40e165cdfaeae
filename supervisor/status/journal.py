"""The event journal: transitions, incidents and commands as JSON lines in `state_dir/events.jsonl`.

Writing must never take the daemon down: a full disk or a vanished directory costs journal lines
(counted in `write_errors`), not the supervision. Reading tolerates what a crash leaves behind:
a torn last line, garbage lines, a rotation between two reads.

Kinds that whoever reaches the API can make in volume (HIGH_VOLUME: a refused login) are written
apart, to `events.access.jsonl` with its own rotation, so no flood of them rotates the incident and
launch records out of `events.jsonl` (issue 50: 475,701 refused logins had emptied `/events` of
incidents). `read` merges both by time; a follow stream tails `events.jsonl` only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

from supervisor.status.eventnames import EventName

MiB = 1024 * 1024
_READ_CHUNK = 64 * 1024
HIGH_VOLUME: frozenset[str] = frozenset({"page_login_refused"})


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _finite(value: object) -> object:
    """NaN and infinities are not JSON; they are written as strings so the line stays parseable."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class Journal:
    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = 10 * MiB,
        backups: int = 3,
        wall: Callable[[], float] = time.time,
        apart: frozenset[str] = HIGH_VOLUME,
        apart_max_bytes: int = 2 * MiB,
        apart_backups: int = 1,
    ) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.apart = apart
        self.apart_path = self.path.with_name(f"{self.path.stem}.access{self.path.suffix}")
        self.apart_max_bytes = apart_max_bytes
        self.apart_backups = apart_backups
        self._wall = wall
        self._lock = threading.Lock()
        self.write_errors = 0
        # Told of every record, written or not (a full disk must not silence a notification).
        self.listeners: list[Callable[[dict[str, object]], None]] = []

    def append(self, event: EventName, /, **fields: object) -> None:
        """Write one line `{"ts": ISO-8601 UTC, "event": event, **fields}`; never raises."""
        record: dict[str, object] = {"ts": _iso(self._wall()), "event": event}
        record.update((k, v) for k, v in fields.items() if k not in record)
        for listener in tuple(self.listeners):
            with contextlib.suppress(Exception):  # a listener's bug costs its notification, not the line
                listener(record)
        try:
            line = json.dumps(_finite(record), default=str, allow_nan=False, ensure_ascii=False) + "\n"
            data = line.encode("utf-8", errors="replace")
            apart = event in self.apart
            path, max_bytes, backups = (
                (self.apart_path, self.apart_max_bytes, self.apart_backups)
                if apart
                else (self.path, self.max_bytes, self.backups)
            )
            with self._lock:
                _rotate_if_needed(path, max_bytes, backups, len(data))
                _append_whole(path, data)
        except Exception:  # a journal line is never worth the daemon
            self.write_errors += 1

    def _backup(self, n: int) -> Path:
        return _backup(self.path, n)

    def read(self, limit: int, match: Callable[[dict[str, object]], bool] | None = None) -> list[dict[str, object]]:
        """The last `limit` well-formed records (that `match`), oldest first, newest last (across
        rotations, and across the main file and the high-volume one, merged by time)."""
        if limit <= 0:
            return []
        main = _read_last(self.path, self.backups, limit, match)
        if not self.apart:
            return main
        side = _read_last(self.apart_path, self.apart_backups, limit, match)
        if not side:
            return main
        merged = sorted(main + side, key=lambda r: str(r.get("ts", "")))  # stable: each file stays in order
        return merged[-limit:]


def _backup(path: Path, n: int) -> Path:
    return path.with_name(f"{path.name}.{n}")


def _rotate_if_needed(path: Path, max_bytes: int, backups: int, incoming: int) -> None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    if size == 0 or size + incoming <= max_bytes:
        return
    if backups == 0:
        path.unlink()
        return
    for n in range(backups - 1, 0, -1):
        src = _backup(path, n)
        if src.exists():
            os.replace(src, _backup(path, n + 1))
    os.replace(path, _backup(path, 1))


def _read_last(
    path: Path, backups: int, limit: int, match: Callable[[dict[str, object]], bool] | None
) -> list[dict[str, object]]:
    """The last `limit` well-formed records of `path` and its backups that `match`, oldest first."""
    newest_first: list[dict[str, object]] = []
    for one in (path, *(_backup(path, n) for n in range(1, backups + 1))):
        for line in _lines_backwards(one):
            record = _parse(line)
            if record is not None and (match is None or match(record)):
                newest_first.append(record)
                if len(newest_first) >= limit:
                    return newest_first[::-1]
    return newest_first[::-1]


def _append_whole(path: Path, data: bytes) -> None:
    """Append one line, all of it or none: a short or failed write (a full disk) is cut back off."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # a line a crash left unfinished ends here; the next starts on its own
        view = memoryview(data)
        try:
            while view:
                n = os.write(fd, view)
                if n <= 0:
                    raise OSError(errno.ENOSPC, "short write")
                view = view[n:]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def _parse(line: bytes) -> dict[str, object] | None:
    try:
        value = json.loads(line, parse_constant=lambda _c: None)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _lines_backwards(path: Path) -> Iterator[bytes]:
    """The file's lines from the last to the first; a missing or unreadable file has none."""
    try:
        with open(path, "rb") as f:
            yield from _backwards(f)
    except OSError:
        return


def _backwards(f: BinaryIO) -> Iterator[bytes]:
    pos = f.seek(0, os.SEEK_END)
    tail = b""
    while pos > 0:
        step = min(_READ_CHUNK, pos)
        pos -= step
        f.seek(pos)
        parts = (f.read(step) + tail).split(b"\n")
        tail = parts[0]  # may continue in the previous chunk
        for line in reversed(parts[1:]):
            if line.strip():
                yield line
    if tail.strip():
        yield tail
