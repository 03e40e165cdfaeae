"""Where `bundles get` may write what a daemon answers (issue 50): the names come from the wire, so
the answering side must not choose the place.

A bundle's file names are accepted only as plain names (no separator, no `..`, not absolute, no NUL
or control character); a whole bundle is written into a directory this call creates (never one that
was there), each file opened relative to that directory's descriptor with `O_EXCL | O_NOFOLLOW`, so
neither a planted symlink nor a directory swapped in meanwhile moves a write elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_NAME_BYTES = 255  # NAME_MAX on Linux
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def plain_name(name: object) -> bool:
    """A single path component that names a file here: not empty, not `.` or `..`, no `/` or `\\`,
    no NUL or other control character, at most NAME_MAX bytes."""
    if not isinstance(name, str) or name in ("", ".", ".."):
        return False
    if any(c in "/\\" or ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return False
    try:
        return len(name.encode()) <= MAX_NAME_BYTES
    except UnicodeEncodeError:  # a lone surrogate
        return False


def make_private_dir(path: Path) -> int:
    """Create `path` (it must not exist; FileExistsError) and return a descriptor of it."""
    os.mkdir(path, 0o700)
    return os.open(path, _DIR_FLAGS)


def write_new(name: str, data: bytes, *, dir_fd: int | None = None, mode: int = 0o600) -> None:
    """Write `data` to a file that did not exist (FileExistsError, also for a symlink, dangling or
    not), relative to `dir_fd` when given."""
    fd = os.open(name, _FILE_FLAGS, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
