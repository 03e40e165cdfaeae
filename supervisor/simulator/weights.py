"""Loading "weights" for real: bytes read from a file (rchar rises) and memory held (RSS rises).

With `--model-path` a directory holding `*.safetensors`, those files are read; otherwise a scratch
file of a few MB is made (in the model directory when it exists and is writable, else in the temp
directory) and unlinked at once, so nothing is left behind even after SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time

CHUNK = 256 * 1024
SCRATCH_BYTES = 4 * 1024 * 1024
PAGE = 4096


def _scratch_file(model_path: str) -> int:
    directory = model_path if os.path.isdir(model_path) and os.access(model_path, os.W_OK) else None
    fd, path = tempfile.mkstemp(prefix=".sglang-weights-", dir=directory)
    try:
        block = os.urandom(64 * 1024)
        for _ in range(SCRATCH_BYTES // len(block)):
            os.write(fd, block)
    finally:
        os.unlink(path)
    return fd


class WeightReader:
    def __init__(self, files: list[str], model_path: str) -> None:
        self._fds: list[int] = []
        for path in files:
            try:
                self._fds.append(os.open(path, os.O_RDONLY))
            except OSError:
                continue
        if not self._fds:
            self._fds.append(_scratch_file(model_path))
        self._index = 0
        self._offset = 0
        self.held: list[bytearray] = []  # the "weights": kept for the life of the process
        self.bytes_read = 0

    def read_chunk(self) -> int:
        """Read the next chunk, wrapping around the files forever; returns bytes read."""
        for _ in range(2 * len(self._fds)):
            fd = self._fds[self._index]
            data = os.pread(fd, CHUNK, self._offset)
            if data:
                self._offset += len(data)
                self.bytes_read += len(data)
                return len(data)
            self._index = (self._index + 1) % len(self._fds)
            self._offset = 0
        return 0

    def hold(self, nbytes: int) -> None:
        """Allocate and touch every page, so the memory counts in RSS."""
        if nbytes <= 0:
            return
        buf = bytearray(nbytes)
        buf[::PAGE] = b"\x01" * len(range(0, nbytes, PAGE))
        self.held.append(buf)

    def read_for(self, seconds: float, bytes_per_s: float, hold_bytes: int = 0, busy_fraction: float = 0.0) -> None:
        """Read at about `bytes_per_s` for `seconds`, growing RSS by `hold_bytes` along the way.

        `busy_fraction` of the time is spent computing (deserialising, say), the rest waiting.
        """
        start = time.monotonic()
        end = start + seconds
        done = 0
        held = 0
        while True:
            now = time.monotonic()
            if now >= end:
                break
            target = (now - start) * bytes_per_s
            while done < target:
                got = self.read_chunk()
                if not got:
                    break
                done += got
            want_held = int(hold_bytes * min(1.0, (now - start) / seconds)) if seconds > 0 else hold_bytes
            if want_held - held >= 64 * 1024:
                self.hold(want_held - held)
                held = want_held
            tick = min(0.05, max(0.0, end - now))
            if busy_fraction > 0:
                _burn(tick * busy_fraction)
                tick *= 1 - busy_fraction
            time.sleep(tick)
        self.hold(hold_bytes - held)

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for i in range(200):
            x += i * i
