"""Bundle directories on disk: atomic write and retention (the API reads them through api/bundles.py).

A bundle is written into `diag_dir/.tmp-<id>`, every file fsynced, then renamed to
`diag_dir/<id>`: a reader (or a crash) sees a whole bundle or none.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

_SAFE = re.compile(r"^[A-Za-z0-9._-]+$")
SUMMARY = "summary.json"
_STALE_TMP_S = 3600.0  # a .tmp- directory this old is a crashed write, not one in progress


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "xb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def safe_id(wanted: str) -> str:
    """A directory name from an incident id: characters outside [A-Za-z0-9._-] become `_`."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", wanted).lstrip(".")
    return cleaned or "incident"


def unique_id(diag_dir: Path, wanted: str) -> str:
    """`wanted`, or `wanted-2`, `-3`, ... when a bundle of that name exists (two in one second)."""
    candidate, n = wanted, 1
    while (diag_dir / candidate).exists() or (diag_dir / f".tmp-{candidate}").exists():
        n += 1
        candidate = f"{wanted}-{n}"
    return candidate


def write_bundle(diag_dir: Path, bundle_id: str, files: Mapping[str, bytes]) -> Path:
    """Write atomically; raise OSError (and leave nothing behind) when that is impossible."""
    if not _SAFE.match(bundle_id):
        raise ValueError(f"bundle id {bundle_id!r} must match [A-Za-z0-9._-]+")
    diag_dir.mkdir(parents=True, exist_ok=True)
    tmp = diag_dir / f".tmp-{bundle_id}"
    final = diag_dir / bundle_id
    try:
        tmp.mkdir()
        for name, data in files.items():
            _write_file(tmp / name, data)
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(diag_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _bundle_dirs(diag_dir: Path) -> list[Path]:
    try:
        entries = list(os.scandir(diag_dir))
    except OSError:
        return []
    dirs = [
        Path(e.path)
        for e in entries
        if not e.name.startswith(".")
        and e.is_dir(follow_symlinks=False)
        and os.path.isfile(os.path.join(e.path, SUMMARY))
    ]
    # Oldest first: by modification time, then by name (ids start with the UTC time).
    return sorted(dirs, key=lambda p: (p.stat().st_mtime_ns, p.name))


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def enforce_retention(
    diag_dir: Path, keep: int, max_bytes: int, protect: str | None
) -> tuple[list[str], list[str]]:
    """Delete oldest bundles until at most `keep` remain and they total <= max_bytes; never `protect`.

    Returns (removed ids, errors). Also clears `.tmp-` directories left by a crashed write.
    """
    removed: list[str] = []
    errors: list[str] = []
    now = time.time()
    for entry in diag_dir.glob(".tmp-*"):
        try:
            if entry.is_dir() and not entry.is_symlink() and now - entry.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(entry)
        except OSError as err:
            errors.append(f"cannot remove stale {entry.name}: {err.strerror or err}")
    dirs = _bundle_dirs(diag_dir)
    sizes = {d.name: _dir_bytes(d) for d in dirs}
    total = sum(sizes.values())
    count = len(dirs)
    for d in dirs:
        if count <= keep and total <= max_bytes:
            break
        if d.name == protect:
            continue
        try:
            shutil.rmtree(d)
        except OSError as err:
            errors.append(f"cannot remove old bundle {d.name}: {err.strerror or err}")
            continue
        removed.append(d.name)
        count -= 1
        total -= sizes[d.name]
    return removed, errors
