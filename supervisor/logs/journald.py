"""The server's output, copied to the systemd journal by the log keeper (`[logs] journal = true`).

journald's native protocol (systemd.journal-fields(7), "Native Journal Protocol"): one datagram per
entry on /run/systemd/journal/socket, fields `KEY=value` one a line, MESSAGE in the length-prefixed
binary form so any byte may appear in it. Each entry carries SYSLOG_IDENTIFIER (default `sglang`),
so `journalctl -u sglang-supervisor` shows the daemon and the server together (the keeper runs in
the unit's cgroup) and `journalctl -t sglang` the server alone. PRIORITY comes from SGLang's own
level word where the line has one.

The socket is non-blocking: when journald is slow or gone the line is dropped (and counted), never
waited for, because the keeper must drain the server's pipe or the server blocks on its output.
The files under state_dir/logs stay the complete record. Standard library only (the keeper's rule).

Secrets: the journal is read by more people than the state directory (group `adm`, log shippers),
so each line goes through the bundles' pattern redaction (URL passwords, `Authorization`, bearer
tokens, secret-named flags, assignments and JSON keys: SGLang's `server_args=ServerArgs(api_key=...)`
line included). supervisor/common/redact.py is loaded by its path, without the package (which
would cost the keeper 0.2 s and 25 MB); it uses the standard library only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import socket
import struct
import sys
from collections.abc import Callable
from pathlib import Path

MAX_PARTIAL = 64 * 1024
MAX_MESSAGE = 48 * 1024  # journald's datagram limit is larger; a huge line is cut, the file keeps it
_LEVEL = re.compile(rb"\b(CRITICAL|ERROR|WARNING|WARN|INFO|DEBUG)\b")
_PRIORITY = {b"CRITICAL": b"2", b"ERROR": b"3", b"WARNING": b"4", b"WARN": b"4", b"INFO": b"6", b"DEBUG": b"7"}


def pattern_redaction() -> Callable[[str], str]:
    """`Redactor().text`, from supervisor/common/redact.py loaded on its own."""
    name = "_sglang_supervisor_keeper_redact"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "common" / "redact.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    text: Callable[[str], str] = module.Redactor().text
    return text


def entry(message: bytes, identifier: bytes) -> bytes:
    """One native-protocol datagram for `message`."""
    level = _LEVEL.search(message[:200])
    prio = _PRIORITY[level.group(1)] if level else b"6"
    head = b"SYSLOG_IDENTIFIER=" + identifier + b"\nPRIORITY=" + prio + b"\n"
    return head + b"MESSAGE\n" + struct.pack("<Q", len(message)) + message + b"\n"


class JournalSender:
    """`write(chunk)` with the server's raw output; whole lines go to the journal, one entry each."""

    def __init__(self, path: str, identifier: str) -> None:
        self.path = path
        self.identifier = identifier.encode()[:64] or b"sglang"
        self.sent = 0
        self.dropped = 0
        self._partial = b""
        self._redact = pattern_redaction()
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)

    def write(self, chunk: bytes) -> None:
        parts = (self._partial + chunk).split(b"\n")
        self._partial = parts.pop()[-MAX_PARTIAL:]
        for line in parts:
            self._send(line)

    def _send(self, line: bytes) -> None:
        if b"\r" in line:  # a progress bar's updates: its last state only
            segments = [s for s in line.split(b"\r") if s.strip()]
            line = segments[-1] if segments else b""
        if not line.strip() or self._sock is None:
            return
        try:
            text = self._redact(line[:MAX_MESSAGE].decode("utf-8", errors="replace"))
            self._sock.sendto(entry(text.encode("utf-8"), self.identifier), self.path)
            self.sent += 1
        except OSError:  # journald busy (EAGAIN), gone, or the socket missing: the file has the line
            self.dropped += 1

    def close(self) -> None:
        if self._partial:
            self._send(self._partial)
            self._partial = b""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
