"""Output exactly as SGLang's loggers and uvicorn's write it.

Every record is one `os.write` of whole lines (atomic on a pipe up to PIPE_BUF), straight to the
file descriptor with no Python buffer in between, so lines of several processes interleave as whole
lines and a full pipe blocks the writer, as it blocks a real server.
"""

from __future__ import annotations

import os
import threading
import time

STDOUT_FD = 1
STDERR_FD = 2


def timestamp(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() if now is None else now))


def write_all(fd: int, data: bytes) -> None:
    """Write everything, blocking while the reader is slow; a vanished reader drops the output."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:  # EPIPE, EBADF: nobody reads; a logging handler would swallow it too
            return
        view = view[written:]


class LogWriter:
    """`[YYYY-MM-DD HH:MM:SS{prefix}] message` on stderr; prefix is "" for the main process, " TP0"..."""

    def __init__(self, prefix: str = "", fd: int = STDERR_FD, access_fd: int = STDOUT_FD) -> None:
        self.prefix = prefix
        self.fd = fd
        self.access_fd = access_fd
        # Reentrant: SGLang's signal handlers log, and a handler can run while the main thread is
        # inside a write. The access log is uvicorn's separate handler, with its own lock.
        self._lock = threading.RLock()
        self._access_lock = threading.Lock()

    def info(self, message: str) -> None:
        self.raw(f"[{timestamp()}{self.prefix}] {message}\n")

    # SGLang's format has no level name: warnings and errors look like info lines.
    warning = info
    error = info

    def uvicorn(self, message: str, level: str = "INFO") -> None:
        """uvicorn's default logger as SGLang configures it: `[time] INFO:     message`."""
        self.raw(f"[{timestamp()}] {level + ':':<9} {message}\n")

    def access(self, client: str, request_line: str, status: str) -> None:
        """uvicorn's access logger, which writes to stdout."""
        line = f'[{timestamp()}] {"INFO:":<9} {client} - "{request_line}" {status}\n'
        with self._access_lock:
            write_all(self.access_fd, line.encode("utf-8", "replace"))

    def raw(self, text: str) -> None:
        self.raw_bytes(text.encode("utf-8", "replace"))

    def raw_bytes(self, data: bytes) -> None:
        with self._lock:
            write_all(self.fd, data)
