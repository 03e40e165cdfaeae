"""Files written whole or not at all: the state, the launch book, the shared-memory ledger."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    """All of `data` lands in `path`, or `path` keeps its old content and OSError says why.

    `os.write` may write less than asked (a nearly full disk): it is called again for the rest,
    and a write that makes no progress is an error; the temporary file is removed on any failure.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                if n <= 0:
                    raise OSError(errno.ENOSPC, f"short write to {tmp}")
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
