"""How much of the model's weight files the page cache holds (mincore), and reading them ahead
(posix_fadvise WILLNEED) while the evidence is captured and the GPUs are released (issue 36).

A relaunch that finds its weights in the page cache loads them at memory speed; one that does not
pays a cold read from storage. Both calls only observe or hint: nothing is locked, pinned or
evicted, and a file that cannot be opened or mapped is counted as not resident with the error named.
Blocking (a walk, maps of large files): the owner runs these in a thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from supervisor.status.launchviews import ResidencyView

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
CHUNK = 1 << 30  # map at most 1 GiB at a time: the residency vector stays at 256 KiB
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class Residency:
    files: int
    bytes: int
    resident_bytes: int
    error: str | None = None

    @property
    def fraction(self) -> float:
        return self.resident_bytes / self.bytes if self.bytes else 0.0

    def view(self, readahead: bool) -> ResidencyView:
        return ResidencyView(
            files=self.files,
            bytes=self.bytes,
            resident_bytes=self.resident_bytes,
            fraction=round(self.fraction, 4),
            readahead=readahead,
            error=self.error,
        )


def weight_files(model_path: str, limit: int) -> list[Path]:
    """The weight files of a local model (a file, or a directory and its immediate sub-directories);
    a hub id or a missing path has none."""
    if not model_path:
        return []
    p = Path(model_path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        return []
    found: list[Path] = []
    for d in (p, *sorted(c for c in p.iterdir() if c.is_dir())):
        try:
            entries = sorted(d.iterdir())
        except OSError:
            continue
        for f in entries:
            if f.suffix in WEIGHT_SUFFIXES and f.is_file():
                found.append(f)
                if len(found) >= limit:
                    return found
    return found


def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    lib.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    lib.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    return lib


def _resident_of(lib: ctypes.CDLL, fd: int, size: int) -> int:
    resident = 0
    offset = 0
    failed = ctypes.c_void_p(-1).value
    while offset < size:
        length = min(CHUNK, size - offset)
        addr = lib.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        if addr is None or addr == failed:
            raise OSError(ctypes.get_errno(), f"mmap: {os.strerror(ctypes.get_errno())}")
        try:
            pages = (length + _PAGE - 1) // _PAGE
            vec = ctypes.create_string_buffer(pages)
            if lib.mincore(addr, length, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore: {os.strerror(ctypes.get_errno())}")
            in_core = sum(b & 1 for b in vec.raw)
            resident += min(length, in_core * _PAGE)
        finally:
            lib.munmap(addr, length)
        offset += length
    return resident


def measure(files: Sequence[Path]) -> Residency:
    """Bytes of `files` resident in the page cache now (mincore over read-only shared maps)."""
    total = resident = 0
    errors: list[str] = []
    try:
        lib = _libc()
    except (OSError, AttributeError) as err:
        return Residency(len(files), 0, 0, error=f"mincore unavailable: {err}")
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            errors.append(f"{f.name}: {err.strerror}")
            continue
        try:
            size = os.fstat(fd).st_size
            total += size
            if size:
                resident += _resident_of(lib, fd, size)
        except OSError as err:
            errors.append(f"{f.name}: {err}")
        finally:
            os.close(fd)
    return Residency(len(files), total, resident, error="; ".join(errors)[:500] or None)


# One WILLNEED reads ahead at most the device's read-ahead window (Linux caps each call at
# max(io_pages, ra_pages): about 8 MiB of a 16 MiB file here, 128 KiB on many disks), so a whole
# file is asked for in steps of this.
READ_AHEAD_STEP = 2 << 20
# The asks block while the device's queue is full: they stop after this long (the relaunch reads
# the rest itself), so a daemon that shuts down never waits minutes on a thread reading 600 GB.
READ_AHEAD_BUDGET_S = 30.0


def read_ahead(files: Sequence[Path], budget_s: float = READ_AHEAD_BUDGET_S) -> str | None:
    """Ask the kernel to read `files` into the page cache (asynchronous; nothing is pinned), step by
    step over each file, for at most `budget_s`. Returns the errors, if any, in one line."""
    errors: list[str] = []
    deadline = time.monotonic() + budget_s
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            errors.append(f"{f.name}: {err.strerror}")
            continue
        try:
            size = os.fstat(fd).st_size
            for offset in range(0, size, READ_AHEAD_STEP):
                if time.monotonic() > deadline:
                    errors.append(f"read-ahead stopped after {budget_s:g} s (the relaunch reads the rest)")
                    break
                os.posix_fadvise(fd, offset, READ_AHEAD_STEP, os.POSIX_FADV_WILLNEED)
        except OSError as err:
            errors.append(f"{f.name}: {err.strerror}")
        finally:
            os.close(fd)
        if time.monotonic() > deadline:
            break
    return "; ".join(errors)[:500] or None
