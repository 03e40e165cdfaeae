"""Output exactly as vLLM 0.26.0's processes write it.

- Records: vllm/logger.py:22 `_FORMAT` = `{VLLM_LOGGING_PREFIX}%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d]
  %(message)s`, date `%m-%d %H:%M:%S` (logger.py:26), on stdout (envs.py:43 `VLLM_LOGGING_STREAM`), through
  `NewLineFormatter` (logging_utils/formatter.py:74): every newline inside a record, a traceback's
  included, becomes `\\r\\n` plus the record's header again.
- `decorate_logs` (utils/system_utils.py:201-250): once a process calls it, every line it writes to
  stdout or stderr starts with `(name pid=N) ` (no colour off a terminal), tracked per stream with
  `start_new_line`, so a tqdm bar's `\\r` redraws stay on the line the prefix began.
- tqdm bars and tracebacks printed by Python itself go to stderr; uvicorn's default logger
  (`%(levelprefix)s %(message)s`) to stderr, its access log to stdout (uvicorn/config.py LOGGING_CONFIG).

Every write is one `os.write` of what the real stream would have written for that call, as
loglines.py does for SGLang, so a full pipe blocks the writer as it blocks vLLM.
"""

from __future__ import annotations

import os
import threading
import time

from supervisor.simulator.loglines import STDERR_FD, STDOUT_FD, write_all
from supervisor.simulator.vllm.lines import LogSite


class DecoratedStream:
    """One file descriptor as `_add_prefix` leaves it: the prefix at the start of every line."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.prefix = b""
        self._start_new_line = True
        self._lock = threading.RLock()  # signal handlers log too

    def decorate(self, name: str, pid: int) -> None:
        with self._lock:
            self.prefix = f"({name} pid={pid}) ".encode()

    def write(self, data: bytes) -> None:
        """`write_with_prefix` (system_utils.py:215-229), for one write call."""
        if not data:
            return
        with self._lock:
            if not self.prefix:
                write_all(self.fd, data)
                return
            out = bytearray()
            if self._start_new_line:
                out += self.prefix
            lines = data.split(b"\n")
            for i, piece in enumerate(lines):
                out += piece
                if i < len(lines) - 1:
                    out += b"\n"
                    if i < len(lines) - 2 or lines[-1]:
                        out += self.prefix
            self._start_new_line = data.endswith(b"\n")
            write_all(self.fd, bytes(out))


class VllmLog:
    """One vLLM process's output: records on stdout, bars and Python's own tracebacks on stderr."""

    def __init__(self, out_fd: int = STDOUT_FD, err_fd: int = STDERR_FD) -> None:
        self.out = DecoratedStream(out_fd)
        self.err = DecoratedStream(err_fd)
        self.logging_prefix = os.environ.get("VLLM_LOGGING_PREFIX", "")  # envs.py:821

    def decorate(self, name: str) -> None:
        """`decorate_logs(name)`: both streams get `(name pid=N) ` from now on (a second call replaces it)."""
        pid = os.getpid()
        self.out.decorate(name, pid)
        self.err.decorate(name, pid)

    def record(self, site: LogSite, *args: object, exc_text: str = "") -> None:
        """`logger.<level>(site.template, *args)`, or `logger.exception(...)` with the traceback in exc_text."""
        message = site.template % args if args else site.template
        header = f"{self.logging_prefix}{site.level} {time.strftime('%m-%d %H:%M:%S')} [{site.filename}:{site.line}] "
        msg = header + message
        if exc_text:
            msg += "\n" + exc_text.rstrip("\n")
        if message:
            msg = msg.replace("\n", "\r\n" + msg.split(message)[0])
        self.out.write((msg + "\n").encode("utf-8", "replace"))

    def raw(self, text: str) -> None:
        """Text on the logging stream (stdout), as a record's handler or print() would put it."""
        self.out.write(text.encode("utf-8", "replace"))

    def raw_bytes(self, data: bytes) -> None:
        self.out.write(data)

    def stderr(self, text: str) -> None:
        """tqdm's bars and Python's own tracebacks (`Process EngineCore:` and the like)."""
        self.err.write(text.encode("utf-8", "replace"))

    def uvicorn(self, message: str, level: str = "INFO") -> None:
        """uvicorn's default formatter: `%(levelprefix)s %(message)s`, levelprefix `INFO:` padded to 9."""
        self.err.write(f"{level + ':':<9} {message}\n".encode())

    def access(self, client: str, request_line: str, status: str) -> None:
        """uvicorn's access log on stdout: `%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s`."""
        self.out.write(f'{"INFO:":<9} {client} - "{request_line}" {status}\n'.encode("utf-8", "replace"))
