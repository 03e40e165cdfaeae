"""Run one dump tool as an asyncio subprocess: bounded in time and in output size.

Each tool runs in a session of its own, so that at its timeout (and after it exits) the helpers it
forked -- cuda-gdb starts a backend per attach -- go with it instead of outliving the capture.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_CAP_BYTES = 2 * 1024 * 1024
_KILL_GRACE_S = 2.0  # after kill(): how long to wait for the exit and the pipes to close
_TERM_GRACE_S = 1.0  # at the timeout, SIGTERM first: gdb then detaches cleanly and flushes its output


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None: could not start, or killed at the timeout
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    missing: bool = False  # the executable was not there (or not executable)
    bytes: int = 0  # stdout bytes the tool wrote, including any beyond the cap
    truncated: bool = False


async def _drain(stream: asyncio.StreamReader | None, buf: bytearray, cap: int, seen: list[int]) -> None:
    """Read to EOF, keeping the first `cap` bytes: a tool blocked on a full pipe would never exit."""
    if stream is None:
        return
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        seen[0] += len(chunk)
        room = cap - len(buf)
        if room > 0:
            buf += chunk[:room]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal the tool's own session (its pid is the group id); gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _kill_marked(var: str, value: str, proc_root: str = "/proc") -> int:
    """SIGKILL every process of this user whose environment holds `var=value` (a hook's marker:
    a `setsid` grandchild left the hook's group but kept its environment); how many were found."""
    needle = f"{var}={value}".encode()
    uid, me, found = os.getuid(), os.getpid(), 0
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return 0
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"{proc_root}/{name}").st_uid != uid:
                continue
            with open(f"{proc_root}/{name}/environ", "rb") as f:
                env = f.read(1 << 20)
        except OSError:
            continue
        if needle + b"\0" in env or env.endswith(needle):
            found += 1
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(name), signal.SIGKILL)
    return found


async def _reaped(proc: asyncio.subprocess.Process) -> None:
    """Wait, bounded, until the killed tool's exit is seen. Its transport closes only then: a caller
    that cancelled the run and closed its loop at once (the daemon stopping, a test ending) left the
    transport and its pipes open, Python's 'unclosed transport' ResourceWarning."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(proc.wait()), _KILL_GRACE_S)


def _text(buf: bytearray) -> str:
    return bytes(buf).decode("utf-8", errors="replace")


async def run_tool(
    argv: tuple[str, ...],
    timeout_s: float,
    *,
    env: Mapping[str, str] | None = None,
    cap_bytes: int = DEFAULT_CAP_BYTES,
    stdin: bytes | None = None,
    own_session: bool = True,
    marker: tuple[str, str] | None = None,
) -> RunResult:
    """Run `argv` to completion or `timeout_s`; on timeout kill it and keep what it had printed.

    `own_session=False`: a process group of its own inside the daemon's session, for what may run
    while the server is stopped (a notification hook): the stop takes any child of the daemon in
    another session for an orphan of the server tree (`cgroup.adopted_orphans`).
    `marker`: an environment variable and value that only this run's processes carry (it must be in
    `env`); at the timeout every process of this user holding it is killed too, wherever its group.
    """
    start = time.monotonic()
    group: dict[str, object] = {"start_new_session": True}
    if not own_session:
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
            **group,  # type: ignore[arg-type]
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as err:
        return RunResult(
            None, "", f"{argv[0]}: {err.strerror or err}", time.monotonic() - start, missing=True
        )
    if stdin is not None and proc.stdin is not None:
        proc.stdin.write(stdin)  # small (an event); a hook that never reads gets EPIPE, not a hang
        with contextlib.suppress(OSError):
            proc.stdin.close()
    out, errs = bytearray(), bytearray()
    seen_out, seen_err = [0], [0]
    readers = asyncio.gather(
        _drain(proc.stdout, out, cap_bytes, seen_out), _drain(proc.stderr, errs, 65536, seen_err)
    )
    timed_out = False

    async def finish() -> int:
        await asyncio.shield(readers)  # shielded: after a kill the rest of the output is still read
        return await proc.wait()

    try:
        code: int | None = await asyncio.wait_for(finish(), timeout_s)
    except asyncio.TimeoutError:
        timed_out = True
        _signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), _TERM_GRACE_S)
        # Our own tool's group; the tracee it attached to is detached by the kernel.
        _signal_group(proc.pid, signal.SIGKILL)
        if marker is not None:
            await asyncio.to_thread(_kill_marked, *marker)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), _KILL_GRACE_S)
        with contextlib.suppress(asyncio.TimeoutError):
            # A grandchild holding the pipe open must not hold the capture.
            await asyncio.wait_for(asyncio.shield(readers), _KILL_GRACE_S)
        code = None
    finally:
        # Cancelled (daemon stopping): never leave gdb attached behind us; and no helper outlives it.
        _signal_group(proc.pid, signal.SIGKILL)
        if not readers.done():
            readers.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await readers
        if proc.returncode is None:  # cancelled: the exit is not seen yet
            await _reaped(proc)
    return RunResult(
        exit_code=code,
        stdout=_text(out),
        stderr=_text(errs),
        duration_s=time.monotonic() - start,
        timed_out=timed_out,
        bytes=seen_out[0],
        truncated=seen_out[0] > cap_bytes,
    )
