"""Shared fixtures: a free port, a per-test marker whose processes are all killed afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence

import pytest

from probes.proctree import scan_tree
from supervisor.process import ServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


WaitFn = Callable[..., bool]


def _wait_until(cond: Callable[[], object], timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return bool(cond())


@pytest.fixture
def wait_until() -> WaitFn:
    """`wait_until(cond, timeout=5.0)`: poll `cond` until true; returns whether it became true."""
    return _wait_until


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _kill_marked(marker: str) -> None:
    # Deliberately independent of supervisor.process.stop_tree: cleanup must work even when it is broken.
    for _ in range(50):
        pids = [pid for pid, st in scan_tree(None, marker).items() if not st.zombie]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


@pytest.fixture
def marker() -> Iterator[str]:
    """A marker unique to the test; every process still carrying it afterwards is SIGKILLed."""
    value = f"test-{uuid.uuid4().hex[:12]}"
    yield value
    _kill_marked(value)


SpawnFn = Callable[..., ServerProcess]


@pytest.fixture
def spawn(marker: str) -> Iterator[SpawnFn]:
    """Start a child through ServerProcess.spawn with the test's marker; reaped and closed afterwards."""
    started: list[ServerProcess] = []

    def _spawn(
        argv: Sequence[str], env: dict[str, str] | None = None, *, other_marker: str | None = None
    ) -> ServerProcess:
        full_env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
        proc = ServerProcess.spawn(argv, full_env, other_marker or marker)
        started.append(proc)
        return proc

    yield _spawn
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()
    _kill_marked(marker)


@pytest.fixture
def repo_root() -> str:
    return ROOT
