"""The CLI as real `sglang-supervisor` processes, for integration tests: one command's exit code and
output (`cli`), and a long-running one (`logs -f`, `events --follow`) read line by line (`Follower`)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

CLI = [sys.executable, "-m", "supervisor"]


async def cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env or _env()
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def cli_env() -> dict[str, str]:
    """The test's environment less the token and config a developer may have set."""
    return _env()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("SGLANG_SUPERVISOR_TOKEN", "SGLANG_SUPERVISOR_CONFIG")}


class Follower:
    """A long-running CLI process whose output is read line by line as it comes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    @classmethod
    async def start(cls, *argv: str) -> Follower:
        proc = await asyncio.create_subprocess_exec(
            *CLI, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env()
        )
        return cls(proc)

    async def until(self, pred, timeout: float) -> str:  # type: ignore[no-untyped-def]
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                raw = await asyncio.wait_for(self.proc.stdout.readline(), max(0.1, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if not raw:
                break
            line = raw.decode().rstrip("\n")
            self.lines.append(line)
            if pred(line):
                return line
        raise AssertionError(f"no such line within {timeout} s; got {self.lines[-20:]}")

    async def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return await asyncio.wait_for(self.proc.wait(), 20)
