from __future__ import annotations

import sys
import time

import psutil

from supervisor.diagnostics.runner import run_tool


async def test_output_and_exit_status() -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr)"
    res = await run_tool((sys.executable, "-c", code), 10)
    assert (res.exit_code, res.stdout, res.stderr.strip()) == (0, "out\n", "err")
    assert not res.timed_out and not res.truncated


async def test_timeout_kills_the_tool_and_keeps_partial_output() -> None:
    code = "import time; print('partial', flush=True); time.sleep(60)"
    start = time.monotonic()
    res = await run_tool((sys.executable, "-c", code), 0.5)
    assert time.monotonic() - start < 5
    assert res.timed_out and res.exit_code is None
    assert res.stdout == "partial\n"
    assert not [p for p in psutil.Process().children() if "time.sleep(60)" in " ".join(p.cmdline())]


async def test_output_beyond_the_cap_is_counted_and_dropped() -> None:
    res = await run_tool((sys.executable, "-c", "print('x' * 100000)"), 10, cap_bytes=1000)
    assert len(res.stdout) == 1000 and res.truncated and res.bytes == 100001


async def test_missing_executable() -> None:
    res = await run_tool(("/nonexistent/py-spy", "dump"), 10)
    assert res.missing and res.exit_code is None and "/nonexistent/py-spy" in res.stderr
