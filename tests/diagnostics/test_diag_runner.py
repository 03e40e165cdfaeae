from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable

import psutil
import pytest

from supervisor.common.toolproc import run_tool

WaitFn = Callable[..., bool]


def live_children(needle: str) -> list[int]:
    alive = []
    for p in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if needle in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
    return alive


async def test_output_and_exit_status() -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr)"
    res = await run_tool((sys.executable, "-c", code), 10)
    assert (res.exit_code, res.stdout, res.stderr.strip()) == (0, "out\n", "err")
    assert not res.timed_out and not res.truncated


@pytest.mark.integration  # waits out the tool's timeout
async def test_timeout_kills_the_tool_and_keeps_partial_output() -> None:
    code = "import time; print('partial', flush=True); time.sleep(60)"
    start = time.monotonic()
    res = await run_tool((sys.executable, "-c", code), 0.5)
    assert time.monotonic() - start < 5
    assert res.timed_out and res.exit_code is None
    assert res.stdout == "partial\n"
    assert not live_children("time.sleep(60)")


async def test_output_beyond_the_cap_is_counted_and_dropped() -> None:
    res = await run_tool((sys.executable, "-c", "print('x' * 100000)"), 10, cap_bytes=1000)
    assert len(res.stdout) == 1000 and res.truncated and res.bytes == 100001


async def test_missing_executable() -> None:
    res = await run_tool(("/nonexistent/py-spy", "dump"), 10)
    assert res.missing and res.exit_code is None and "/nonexistent/py-spy" in res.stderr


async def test_cancelling_the_capture_kills_the_tool() -> None:
    import asyncio

    code = "import time; time.sleep(60)"
    task = asyncio.create_task(run_tool((sys.executable, "-c", code), 30))
    await asyncio.sleep(0.3)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

    deadline = time.monotonic() + 5
    while live_children(code) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not live_children(code)


async def test_a_cancelled_run_ends_only_once_the_tool_is_reaped() -> None:
    """The daemon stopping cancels a capture and closes its loop at once: a run that ended before the
    tool's exit was seen left its transport and pipes open (an 'unclosed transport' warning)."""
    import asyncio

    code = "import time; time.sleep(61)"
    task = asyncio.create_task(run_tool((sys.executable, "-c", code), 30))
    found: list[int] = []

    async def started() -> None:
        while not found:
            found.extend(live_children(code))
            await asyncio.sleep(0.02)

    await asyncio.wait_for(started(), 30)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not psutil.pid_exists(found[0])  # killed and reaped, not a zombie waiting for the loop


async def test_helpers_the_tool_forked_do_not_outlive_it(wait_until: WaitFn) -> None:
    # cuda-gdb leaves a backend per attach; a tool's helpers go with the tool.
    res = await run_tool(("/bin/sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"), 10)
    helper = int(res.stdout.strip())
    assert res.exit_code == 0

    def gone() -> bool:
        try:
            return psutil.Process(helper).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert wait_until(gone, timeout=10)


@pytest.mark.integration  # waits out the timeout and the TERM grace
async def test_a_tool_that_ignores_sigterm_is_killed_at_its_timeout() -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('x', flush=True); time.sleep(60)"
    start = time.monotonic()
    res = await run_tool((sys.executable, "-c", code), 0.5)
    assert res.timed_out and res.stdout == "x\n"
    assert time.monotonic() - start < 10
    assert not live_children("SIG_IGN")
