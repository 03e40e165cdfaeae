"""What `GET /logs` and the page's log panel show of the server's output (issue 53): without the
daemon's own probes by default, and with a separator line where each launch began.

The daemon polls the server's health and metrics every few seconds, and the server's access log
writes a line for each (`INFO: 127.0.0.1:37238 - "GET /health HTTP/1.1" 200 OK`): a third of the
lines of a quiet server. Those lines are hidden unless asked for (`logs --all`). Where a launch
begins is in the journal: each `server_launched` record carries the log's (inode, offset) there
(`log_start`), its rung and pid; the tail is read with each line's position, so the separator
lands exactly before the launch's first line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from api.follow import MAX_LINE, TAIL_BUDGET, cut_note
from supervisor.status.journal import Journal

SEPARATOR = "=== sglang-supervisor: "  # how a separator line begins
# An HTTP access line of uvicorn (SGLang, vLLM): the method and the path, up to the query.
_ACCESS = re.compile(rb'"(?:GET|HEAD) (/[^ ?"]*)[^"]*HTTP/[0-9.]+" \d{3}')
_CHUNK = 64 * 1024
LAUNCHES_READ = 50  # the journal's last launches looked at for separators


@dataclass(frozen=True)
class Launch:
    inode: int | None  # None: no log existed yet, so it began the oldest file
    offset: int
    rung: str
    pid: int | None
    at: str

    def separator(self) -> bytes:
        pid = self.pid if self.pid is not None else "?"
        return f"{SEPARATOR}launch of rung {self.rung}, pid {pid}, at {self.at} ===".encode()


def launch_of(record: dict[str, object]) -> Launch | None:
    """A `server_launched` journal record as a launch, or None for any other record."""
    if record.get("event") != "server_launched":
        return None
    raw = record.get("log_start")
    inode, offset = (raw.get("inode"), raw.get("offset")) if isinstance(raw, dict) else (None, 0)
    pid = record.get("pid")
    return Launch(
        inode=inode if isinstance(inode, int) else None,
        offset=offset if isinstance(offset, int) and offset >= 0 else 0,
        rung=str(record.get("rung") or "?"),
        pid=pid if isinstance(pid, int) else None,
        at=str(record.get("ts") or ""),
    )


def launches(journal: Journal, limit: int = LAUNCHES_READ) -> list[Launch]:
    found = (launch_of(r) for r in journal.read(limit, lambda r: r.get("event") == "server_launched"))
    return [x for x in found if x is not None]


def launches_in(lines: Sequence[bytes]) -> list[Launch]:
    """The launches among new journal lines (a follow reads the journal as it grows)."""
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        launch = launch_of(record) if isinstance(record, dict) else None
        if launch is not None:
            out.append(launch)
    return out


def probe_filter(paths: frozenset[str], show_all: bool) -> Callable[[bytes], bool]:
    """`keep(line)`: False for an access line of a GET or HEAD to one of the daemon's probe paths."""
    if show_all:
        return lambda line: True

    def keep(line: bytes) -> bool:
        m = _ACCESS.search(line)
        return m is None or m[1].decode("ascii", "replace") not in paths

    return keep


def _backwards(path: Path, spent: list[int], budget: int) -> Iterator[tuple[int, int, bytes]]:
    """(inode, offset, line) of `path`, newest first, reading at most what `budget` leaves of
    `spent[0]` (shared across files). Each line is held to MAX_LINE bytes however long it is (its
    first MAX_LINE and a note saying how long it was); where the budget ends inside a giant line,
    its newest MAX_LINE bytes, said to be cut (as api/follow.py's tail does)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return
    with f:
        try:
            inode = os.fstat(f.fileno()).st_ino
            pos = f.seek(0, os.SEEK_END)
        except OSError:
            return
        # The line being read backwards, not yet begun: its first bytes so far (up to MAX_LINE + 1),
        # its length, and its newest MAX_LINE bytes.
        head, length, newest = b"", 0, b""
        while pos > 0 and spent[0] < budget:
            step = min(_CHUNK, pos, budget - spent[0])
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            spent[0] += step
            first = chunk.find(b"\n")
            if first < 0:
                head, length = (chunk + head)[: MAX_LINE + 1], length + len(chunk)
                if len(newest) < MAX_LINE:
                    newest = (chunk + newest)[-MAX_LINE:]
                continue
            last = chunk.rfind(b"\n")
            tail = chunk[last + 1 :]
            yield inode, pos + last + 1, _held((tail + head)[: MAX_LINE + 1], length + len(tail))
            segments = chunk[first + 1 : last].split(b"\n") if last > first else []
            off = pos + last
            for seg in reversed(segments):
                off -= len(seg) + 1
                yield inode, off + 1, _held(seg[: MAX_LINE + 1], len(seg))
            head, length, newest = chunk[:first][: MAX_LINE + 1], first, chunk[:first][-MAX_LINE:]
        if length > 0 and pos == 0:
            yield inode, 0, _held(head, length)
        elif length >= MAX_LINE:  # the budget ran out inside a giant line
            yield inode, pos, newest + f" [sglang-supervisor: line cut, over {budget:,} bytes]".encode()


def _held(head: bytes, length: int) -> bytes:
    return head if length <= MAX_LINE else head[:MAX_LINE] + cut_note(length)


def _shown(line: bytes) -> bytes:
    return line.rstrip(b"\r")


def marked_tail(
    log_file: Path,
    n: int,
    known: Sequence[Launch],
    keep: Callable[[bytes], bool],
    backups: int = 5,
    budget: int = TAIL_BUDGET,
) -> list[bytes]:
    """The last `n` lines that `keep` keeps of `log_file` and its rotated backups, oldest first,
    each launch of `known` that begins among them marked by its separator line before its first."""
    if n <= 0:
        return []
    files = (log_file, *(log_file.with_name(f"{log_file.name}.{i}") for i in range(1, backups + 1)))
    age: dict[int, int] = {}
    newest_first: list[tuple[tuple[int, int], bytes]] = []
    spent = [0]
    for i, path in enumerate(files):
        for inode, off, line in _backwards(path, spent, budget):
            age.setdefault(inode, i)
            if line.strip() and keep(line):
                newest_first.append(((-i, off), _shown(line)))
                if len(newest_first) >= n:
                    break
        if len(newest_first) >= n or spent[0] >= budget:
            break
    lines = newest_first[::-1]
    if not lines:
        return [x.separator() for x in known[-1:] if x.inode is None or x.inode in age]
    oldest_file = max(age.values()) if age else 0
    out: list[bytes] = []
    marks = sorted(
        (
            ((-(age[x.inode] if x.inode is not None else oldest_file), x.offset), x)
            for x in known
            if x.inode is None or x.inode in age
        ),
        key=lambda kx: kx[0],
    )
    marks = [(k, x) for k, x in marks if k >= lines[0][0]]  # only launches that begin within the lines shown
    j = 0
    for key, line in lines:
        while j < len(marks) and marks[j][0] <= key:
            out.append(marks[j][1].separator())
            j += 1
        out.append(line)
    out.extend(x.separator() for _, x in marks[j:])  # launched, nothing written yet
    return out
