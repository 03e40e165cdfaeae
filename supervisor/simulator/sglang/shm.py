"""Shared memory as SGLang 0.5.16's schedulers make it: a broadcast-queue segment named
`sgl_shm_mq_<creator pid>_<rand>` (srt/utils/stale_shm_cleanup.make_shm_name), which a SIGKILLed
server leaves behind. Created in `SGLANG_SIM_SHM_DIR` (SGLang: /dev/shm); off when unset, so test
runs do not litter the host's /dev/shm."""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import uuid
from pathlib import Path

SEGMENT_BYTES = 64 * 1024


def open_segment(shm_dir: str | None, kind: str = "mq") -> mmap.mmap | None:
    """Create and map the segment; unlinked on a clean Python exit only (SGLang's children die by
    SIGKILL from its kill_process_tree, which skips every unlink)."""
    if not shm_dir:
        return None
    path = Path(shm_dir) / f"sgl_shm_{kind}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError:
        return None
    try:
        os.ftruncate(fd, SEGMENT_BYTES)
        segment = mmap.mmap(fd, SEGMENT_BYTES)
    finally:
        os.close(fd)
    atexit.register(_unlink, path)
    return segment


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
