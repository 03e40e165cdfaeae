"""`sglang-supervisor logs` to a terminal (issue 33): the server's ANSI and OSC escapes and other
control characters are shown escaped, never sent raw to the operator's terminal; to a pipe the
output is what the server wrote."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

HOSTILE = "\x1b]0;owned\x07\x1b[31mred\x1b[0m \x1b]52;c;ZXZpbA==\x07 bell\x07 tab\tend"


def read_all(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            return out
        if not chunk:
            return out
        out += chunk


def logs_on_a_terminal(api: str) -> bytes:
    leader, follower = pty.openpty()
    cmd = [sys.executable, "-m", "supervisor", "logs", "--url", api, "-n", "2000"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.DEVNULL)
    os.close(follower)
    try:
        out = read_all(leader)
    finally:
        os.close(leader)
        proc.wait(30)
    assert proc.returncode == 0
    return out


async def test_logs_to_a_terminal_show_escapes_escaped(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok", tp=1))
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")
    log = Path(r.settings.state_dir) / "logs" / "server.log"
    with open(log, "a") as f:
        f.write(HOSTILE + "\n")
    out = await asyncio.to_thread(logs_on_a_terminal, r.api)
    assert b"\x1b" not in out and b"\x07" not in out, out[-500:]
    assert b"\\x1b]0;owned\\x07\\x1b[31mred\\x1b[0m \\x1b]52;c;ZXZpbA==\\x07 bell\\x07 tab\tend" in out
    piped = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "supervisor", "logs", "--url", r.api, "-n", "2000"],
        capture_output=True,
        timeout=60,
    )
    assert HOSTILE.encode() in piped.stdout, "a pipe gets the bytes as the server wrote them"
