"""`GET /logs?launch=previous` (`sglang-supervisor logs --previous`): the output of the launch before
this one, as `kubectl logs --previous` gives a crashed container's.

Every `server_launched` record in the journal carries `log_start`, the log's (inode, offset) where
that launch's lines begin; the previous launch's lines run from its start to the current launch's
start, through whichever of server.log, server.log.1 ... hold them now (found by inode, since the
keeper rotates by renaming). Reads are bounded (`MAX_SPAN_BYTES`, the span's end kept): a launch that
wrote gigabytes costs its last 16 MiB. Blocking reads: the route runs this in a worker thread.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from supervisor.status.journal import Journal

MAX_SPAN_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Start:
    inode: int
    offset: int


@dataclass(frozen=True)
class PreviousLaunch:
    rung: str
    pid: int | None
    at: str
    lines: list[bytes]


class NoPreviousLaunch(Exception):
    pass


def _start(record: dict[str, object]) -> Start | None:
    raw = record.get("log_start")
    if not isinstance(raw, dict):
        return None
    inode, offset = raw.get("inode"), raw.get("offset")
    if isinstance(inode, int) and isinstance(offset, int) and offset >= 0:
        return Start(inode, offset)
    return None


def previous_launch(journal: Journal, log_file: Path, n: int, backups: int = 5) -> PreviousLaunch:
    """The last `n` lines of the launch before the current one; NoPreviousLaunch says why not."""
    launches = journal.read(2, lambda r: r.get("event") == "server_launched")
    if len(launches) < 2:
        raise NoPreviousLaunch("the journal holds no launch before the current one")
    before, current = launches
    if "log_start" not in before or "log_start" not in current:
        raise NoPreviousLaunch("the previous launch was journalled by an older daemon, without its log position")
    files = _by_inode(log_file, backups)
    if not files:
        raise NoPreviousLaunch(f"there is no server log at {log_file}")
    # None: there was no log yet at that launch, so its lines begin the oldest file kept
    oldest = max(files.items(), key=lambda kv: kv[1][0])[0]
    start = _start(before) or Start(oldest, 0)
    end = _start(current)
    if end is None:
        raise NoPreviousLaunch("the current launch's log position is unknown")
    if start.inode not in files:
        raise NoPreviousLaunch("the previous launch's output has been rotated away ([logs] backups, max_file_mb)")
    data = _span(files, start, end)
    lines = [ln.rstrip(b"\r") for ln in data.split(b"\n") if ln.strip()]
    if len(data) >= MAX_SPAN_BYTES and lines:
        lines = lines[1:]  # cut at the bound: the first may be partial
    pid = before.get("pid")
    return PreviousLaunch(
        rung=str(before.get("rung") or ""),
        pid=pid if isinstance(pid, int) else None,
        at=str(before.get("ts") or ""),
        lines=lines[-n:] if n > 0 else [],
    )


def _by_inode(log_file: Path, backups: int) -> dict[int, tuple[int, Path]]:
    """inode -> (age, path): 0 for server.log, 1 for server.log.1 (older) ..."""
    out: dict[int, tuple[int, Path]] = {}
    for age, p in enumerate((log_file, *(log_file.with_name(f"{log_file.name}.{i}") for i in range(1, backups + 1)))):
        try:
            out[os.stat(p).st_ino] = (age, p)
        except OSError:
            continue
    return out


def _span(files: dict[int, tuple[int, Path]], start: Start, end: Start) -> bytes:
    """The bytes from `start` to `end` (or to the newest file's end when `end`'s file is gone),
    oldest file first, at most MAX_SPAN_BYTES of the end."""
    first_age = files[start.inode][0]
    end_age = files[end.inode][0] if end.inode in files else 0
    chunks: list[bytes] = []
    kept = 0
    for age in range(end_age, first_age + 1):  # newest first, so the bound keeps the span's end
        path = next((p for a, p in files.values() if a == age), None)
        if path is None:
            continue
        lo = start.offset if age == first_age else 0
        try:
            with open(path, "rb") as f:
                hi = end.offset if (age == end_age and end.inode in files) else f.seek(0, os.SEEK_END)
                lo = max(lo, hi - (MAX_SPAN_BYTES - kept))
                if hi <= lo:
                    continue
                f.seek(lo)
                chunk = f.read(hi - lo)
        except OSError:
            continue
        chunks.append(chunk)
        kept += len(chunk)
        if kept >= MAX_SPAN_BYTES:
            break
    return b"".join(reversed(chunks))
