"""Shared fixtures: a free port, a per-test marker whose processes are all killed afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import freeport
import pytest
import structlog
import waiting

from probes.proctree import scan_tree
from supervisor.logs.reader import LogCapture
from supervisor.process import ServerProcess, spawn_log_keeper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


WaitFn = Callable[..., bool]


def pytest_configure(config: pytest.Config) -> None:
    # A shell starts a background job (`make test &`, nohup in a script) with SIGINT ignored, and an
    # ignored signal stays ignored across exec: every CLI the tests start would then shrug off the
    # Ctrl-C they test. Exec resets a handler (not an ignore) to the default, so children get SIGINT back.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # What the daemon has not configured (the API or a part tested alone) logs through structlog's
    # defaults, which render an exception with rich: every frame's locals, highlighted, took 3-4 s a
    # logged traceback on a loaded machine. The same defaults, the traceback as plain text.
    plain = structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
    structlog.configure(processors=[*structlog.get_config()["processors"][:-1], plain])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--real-systemd",
        action="store_true",
        help="run the tests marked real_systemd (`make systemd` boots their systemd: tests/systemd_real/run.sh)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The real-systemd tier needs a machine that tests/systemd_real/run.sh boots: every other run
    # (make test, make unit, a bare pytest) deselects it rather than skipping it.
    if config.getoption("--real-systemd"):
        return
    dropped = [item for item in items if item.get_closest_marker("real_systemd") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.get_closest_marker("real_systemd") is None]


def _wait_until(cond: Callable[[], object], timeout: float = 5.0, interval: float = 0.02) -> bool:
    return waiting.wait_for(cond, timeout, interval)


@pytest.fixture
def wait_until() -> WaitFn:
    """`wait_until(cond, timeout=5.0)`: poll `cond` until true; returns whether it became true."""
    return _wait_until


@pytest.fixture
def free_port() -> int:
    return freeport.free_port()


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


def _until_exec_done(proc: ServerProcess, timeout: float = 10.0) -> None:
    """Popen returns once exec has closed its error pipe, which is before the kernel has set up the
    new program's environment: /proc/<pid>/environ reads empty for that moment (seen under load),
    so a marker check made at once would fail. Wait until it reads, or the child has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                if f.read(1):
                    return
        except OSError:
            return
        time.sleep(0.01)


@pytest.fixture
def spawn(marker: str) -> Iterator[SpawnFn]:
    """Start a child through ServerProcess.spawn with the test's marker; reaped and closed afterwards."""
    started: list[ServerProcess] = []

    def _spawn(
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        other_marker: str | None = None,
        output: int | None = None,
    ) -> ServerProcess:
        full_env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
        proc = ServerProcess.spawn(argv, full_env, other_marker or marker, output=output)
        started.append(proc)
        _until_exec_done(proc)
        return proc

    yield _spawn
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        for stream in (proc._popen.stdout, proc._popen.stderr):  # pipes only without `output`
            if stream is not None:
                stream.close()
    _kill_marked(marker)


@pytest.fixture
def repo_root() -> str:
    return ROOT


@dataclass
class Simulated:
    proc: ServerProcess
    logs: LogCapture
    port: int


SimFn = Callable[..., Simulated]


@pytest.fixture
def simulator(spawn: SpawnFn, marker: str, free_port: int, tmp_path: Path) -> Iterator[SimFn]:
    """`simulator(scenario, tp_size=4, env=None, *extra_args)`: the SGLang simulator on `free_port`.

    Its output goes through the log keeper to tmp_path/sim-logs, followed by a LogCapture, as the
    daemon runs a server. Skips while the simulator is absent.
    """
    if not os.path.exists(os.path.join(ROOT, "supervisor", "simulator", "__main__.py")):
        pytest.skip("supervisor/simulator is not there yet")
    captures: list[LogCapture] = []
    keepers: list[subprocess.Popen[bytes]] = []

    def _start(scenario: str, tp_size: int = 4, env: dict[str, str] | None = None, *extra: str) -> Simulated:
        argv = [sys.executable, "-m", "supervisor.simulator", "--model-path", "/models/sim-model"]
        argv += ["--tp-size", str(tp_size), "--host", "127.0.0.1", "--port", str(free_port), *extra]
        log_dir = tmp_path / "sim-logs"
        start = LogCapture.end_of(log_dir)  # before the keeper can write: this launch's lines follow
        # Five backups, as the daemon keeps by default: a reader starved by a loaded machine may fall
        # that many rotations behind a flood (220 MB is four rotations here) and still lose no line.
        keeper, write_end, kept = spawn_log_keeper(str(log_dir), "server.log", 50 << 20, 5, dict(os.environ))
        os.close(kept)
        keepers.append(keeper)
        try:
            sim_env = {"SGLANG_SIM_SCENARIO": scenario, "SGLANG_SIM_PACE": "0.1", **(env or {})}
            proc = spawn(argv, sim_env, output=write_end)
        finally:
            os.close(write_end)
        logs = LogCapture(log_dir, memory_lines=5000, start=start).start()
        captures.append(logs)
        return Simulated(proc, logs, free_port)

    yield _start
    _kill_marked(marker)  # first, so the keepers see EOF and end by themselves
    for keeper in keepers:
        keeper.wait(10)
    for logs in captures:
        logs.close(timeout=5)
