"""The daemon's own state files, read as untrusted input (issue 50): whoever can write near the state
directory must not be able to hang the start or turn a watchdog off.

A FIFO named `launches.json` hung the daemon's start (a read of a FIFO waits for a writer), and
`NaN` in it made the learned start-up stall window NaN, which no stall is ever longer than: a
deadlock was judged only by the `startup_timeout_s` backstop. Here a state file is read only from
a regular file (`O_NOFOLLOW`, `O_NONBLOCK`: a link, FIFO, device or directory is refused at once,
and the size is bounded), and every number of the launch book is checked (finite, in range) before
it is used: an entry with one wrong number is dropped, and said why.

Pure functions and one bounded read; the readers (supervisor/daemon/persist.py, the launch book)
call them.
"""

from __future__ import annotations

import errno
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path

MAX_STATE_BYTES = 16 * 1024 * 1024  # a launch book or state.json is kilobytes
MAX_SECONDS = 7 * 24 * 3600.0  # no start-up phase, quiet interval or time to ready is longer
MAX_WALL = 1e11  # a Unix time (year 5138)
MAX_COUNT = 1_000_000


def read_regular(path: Path, limit: int = MAX_STATE_BYTES) -> bytes:
    """The bytes of `path` if it is a regular file (not a symlink, FIFO, socket, device or directory)
    of at most `limit` bytes; FileNotFoundError when it is missing, another OSError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{path} is a symbolic link; state is read only from a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file (a FIFO, socket or device is never read)")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{path} is {st.st_size} bytes, over {limit}")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise OSError(errno.EFBIG, f"{path} grew over {limit} bytes while read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def number(value: object, what: str, lo: float, hi: float) -> float:
    """`value` as a float if it is a finite number (not a bool) in [lo, hi]; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is {str(value)[:40]!r}, not a number")
    f = float(value)
    if not math.isfinite(f) or not lo <= f <= hi:
        raise ValueError(f"{what} is {str(value)[:40]}, not a number in [{lo:g}, {hi:g}]")
    return f


def count(value: object, what: str, hi: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise ValueError(f"{what} is {str(value)[:40]!r}, not an integer in [0, {hi}]")
    return value


def check_book_entry(entry: object) -> None:
    """ValueError naming the first number of a launch-book entry that is not one (or out of range):
    `starts`, every `quiet_s` value, and the last good launch's offsets, time to ready and wall time."""
    if not isinstance(entry, Mapping):
        raise ValueError("not a record")
    count(entry.get("starts"), "starts")
    quiet = entry.get("quiet_s")
    if not isinstance(quiet, Mapping):
        raise ValueError("quiet_s is not a record")
    for phase, q in quiet.items():
        number(q, f"quiet_s[{str(phase)[:40]!r}]", 0.0, MAX_SECONDS)
    good = entry.get("last_good")
    if good is None:
        return
    if not isinstance(good, Mapping) or not isinstance(good.get("offsets"), Mapping):
        raise ValueError("last_good is not a record with offsets")
    for name, at in good["offsets"].items():
        number(at, f"last_good.offsets[{str(name)[:40]!r}]", 0.0, MAX_SECONDS)
    number(good.get("time_to_ready_s"), "last_good.time_to_ready_s", 0.0, MAX_SECONDS)
    number(good.get("wall"), "last_good.wall", 0.0, MAX_WALL)


def book_entries(entries: object) -> tuple[dict[str, Mapping[str, object]], tuple[str, ...]]:
    """The launch book's entries whose numbers all hold, and a sentence for each one dropped."""
    if not isinstance(entries, Mapping):
        return {}, ("entries is not a record: every entry dropped",)
    kept: dict[str, Mapping[str, object]] = {}
    dropped: list[str] = []
    for key, entry in entries.items():
        try:
            check_book_entry(entry)
        except ValueError as err:
            dropped.append(f"entry {str(key)[:60]!r} dropped: {err}")
            continue
        kept[str(key)] = entry
    return kept, tuple(dropped)
