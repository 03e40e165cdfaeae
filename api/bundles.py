"""Read-only access to diagnostic bundles by id and file name, and nothing else.

A bundle is a directory `diag_dir/<id>/` holding `summary.json`, `summary.txt` and tool outputs;
`.tmp-*` directories are captures still being written. Ids and names must match `SAFE_NAME`, so
no separator, `..` or NUL can reach the filesystem, and files are opened relative to directory
descriptors with O_NOFOLLOW, so a symlink planted in a bundle is refused even if it appears
between a check and the open. Everything else is "not found".
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from api.models import BundleDetail, BundleInfo

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_NAME_LEN = 255
SUMMARY = "summary.json"
SUMMARY_MAX_BYTES = 4 * 1024 * 1024
CHUNK = 256 * 1024

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def is_safe_name(name: str) -> bool:
    return len(name) <= MAX_NAME_LEN and SAFE_NAME.fullmatch(name) is not None


def _open_dir(diag_dir: Path, bundle_id: str) -> int | None:
    """A descriptor of `diag_dir/<bundle_id>`, or None if that is not a real bundle directory."""
    if not is_safe_name(bundle_id) or bundle_id.startswith(".tmp-"):
        return None
    try:
        root = os.open(diag_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.open(bundle_id, _DIR_FLAGS, dir_fd=root)
    except OSError:
        return None
    finally:
        os.close(root)


def _open_file(dir_fd: int, name: str) -> int | None:
    """A descriptor of a regular file named `name` directly inside `dir_fd`, never through a link."""
    if not is_safe_name(name):
        return None
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.set_blocking(fd, True)
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _read_summary(dir_fd: int) -> dict[str, Any] | None:
    fd = _open_file(dir_fd, SUMMARY)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(SUMMARY_MAX_BYTES + 1)
    if len(raw) > SUMMARY_MAX_BYTES:
        return None
    try:
        # Non-finite numbers are not JSON; they would break the response, so they become null.
        data = json.loads(raw, parse_constant=lambda _c: None)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _regular_files(dir_fd: int) -> list[str]:
    names: list[str] = []
    with os.scandir(dir_fd) as it:
        for entry in it:
            try:
                if is_safe_name(entry.name) and entry.is_file(follow_symlinks=False):
                    names.append(entry.name)
            except OSError:
                continue
    return sorted(names)


def list_bundles(diag_dir: Path) -> list[BundleInfo]:
    """Finished bundles, newest first (by directory modification time, then id)."""
    found: list[tuple[float, str]] = []
    try:
        with os.scandir(diag_dir) as it:
            for entry in it:
                try:
                    if (
                        is_safe_name(entry.name)
                        and not entry.name.startswith(".tmp-")
                        and entry.is_dir(follow_symlinks=False)
                    ):
                        found.append((entry.stat(follow_symlinks=False).st_mtime, entry.name))
                except OSError:
                    continue
    except OSError:
        return []
    found.sort(key=lambda item: (-item[0], item[1]))
    out: list[BundleInfo] = []
    for _mtime, bundle_id in found:
        dir_fd = _open_dir(diag_dir, bundle_id)
        if dir_fd is None:
            continue
        try:
            out.append(BundleInfo(id=bundle_id, summary=_read_summary(dir_fd)))
        finally:
            os.close(dir_fd)
    return out


def bundle_detail(diag_dir: Path, bundle_id: str) -> BundleDetail | None:
    dir_fd = _open_dir(diag_dir, bundle_id)
    if dir_fd is None:
        return None
    try:
        return BundleDetail(id=bundle_id, summary=_read_summary(dir_fd), files=_regular_files(dir_fd))
    except OSError:
        return None
    finally:
        os.close(dir_fd)


def open_bundle_file(diag_dir: Path, bundle_id: str, name: str) -> int | None:
    """A blocking descriptor of the bundle's regular file `name`, or None; the caller closes it."""
    dir_fd = _open_dir(diag_dir, bundle_id)
    if dir_fd is None:
        return None
    try:
        return _open_file(dir_fd, name)
    finally:
        os.close(dir_fd)


def read_chunks(fd: int) -> Iterator[bytes]:
    """The file's bytes in chunks; closes the descriptor when done, abandoned or garbage collected."""
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def media_type(name: str) -> str:
    return "application/json" if name.endswith(".json") else "text/plain; charset=utf-8"
