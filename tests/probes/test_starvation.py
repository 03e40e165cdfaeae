"""The starvation probe on real processes: a starved one's run-queue wait grows, a deadlocked one's does not.

The starved child and its CPU hogs are pinned to one CPU (os.sched_setaffinity) and the child runs
at nice 19 beside hogs at nice 0, so it is runnable nearly all the time and runs almost never,
however loaded the rest of the machine is. The deadlocked child blocks on a lock it already holds
(a futex wait) and in a sleep: never runnable, so its wait stays ~0 on the same loaded CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from probes.starvation import StarvationProbe, parse_psi, parse_schedstat

HOGS = 3
SPIN = "while True: pass"


def _cpu() -> int:
    return max(os.sched_getaffinity(0))


def _child(body: str) -> subprocess.Popen[bytes]:
    prelude = f"import os, threading, time\nos.sched_setaffinity(0, {{{_cpu()}}})\n"
    return subprocess.Popen([sys.executable, "-c", prelude + body])


def _tids(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def _states(pid: int) -> list[str]:
    out = []
    for tid in _tids(pid):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            out.append(f.read().rpartition(")")[2].split()[0])
    return out


def _until(what: str, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _renice(pid: int, nice: int) -> None:
    for tid in _tids(pid):  # per thread on Linux: every thread of the process
        os.setpriority(os.PRIO_PROCESS, tid, nice)


@contextmanager
def _processes(*bodies: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for body in bodies:
            procs.append(_child(body))
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _waited(probe: StarvationProbe, pid: int, seconds: float) -> tuple[float, float, int]:
    """(run-queue wait gained, on-CPU time gained, threads) over `seconds` of wall time."""
    first = probe.observe([pid])
    time.sleep(seconds)
    second = probe.observe([pid])
    assert first.available and second.available
    return second.run_wait_s - first.run_wait_s, second.on_cpu_s - first.on_cpu_s, second.threads


STARVED = f"for _ in range(3): threading.Thread(target=exec, args=({SPIN!r},), daemon=True).start()\n{SPIN}"
DEADLOCKED = (
    "lock = threading.Lock()\nlock.acquire()\n"
    "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\nlock.acquire()\n"
)


@pytest.mark.integration  # CPU hogs and children for seconds
def test_a_starved_process_waits_and_a_deadlocked_one_does_not() -> None:
    probe = StarvationProbe()
    with _processes(STARVED, DEADLOCKED) as (starved, deadlocked):
        # Both started at nice 0 (start-up is not what is measured), then ready: four spinning
        # threads in one, every thread blocked (futex, sleep) in the other.
        _until("the spinner's threads", lambda: len(_tids(starved.pid)) >= 4)
        _until("the deadlock", lambda: len(_states(deadlocked.pid)) >= 2 and set(_states(deadlocked.pid)) == {"S"})
        _renice(starved.pid, 19)
        _renice(deadlocked.pid, 19)
        with _processes(*[SPIN] * HOGS):  # at nice 0, on the same CPU
            time.sleep(0.3)
            s_wait, s_cpu, s_threads = _waited(probe, starved.pid, 1.5)
            d_wait, d_cpu, d_threads = _waited(probe, deadlocked.pid, 1.5)
    assert s_threads >= 4 and d_threads >= 2
    # Four runnable threads behind three hogs at nice 0: well over a second of wait per 1.5 s.
    assert s_wait >= 1.0, (s_wait, s_cpu)
    assert s_cpu < 0.5 * s_wait  # it wanted the CPU far more than it got it
    assert d_wait < 0.05, d_wait
    assert d_cpu < 0.05, d_cpu


@pytest.mark.integration  # a spinning child for seconds
def test_a_spinner_at_normal_priority_gets_cpu() -> None:
    """The other side of the first test: a spinner at nice 0 beside one hog is always runnable, so
    every wall second is either run or run-queue wait; how it splits depends on the machine's load
    (CI shares its cores), so only the sum is asserted, and that it ran at all."""
    probe = StarvationProbe()
    with _processes(SPIN, SPIN) as (spinner, _hog):
        time.sleep(0.5)
        wait, cpu, _ = _waited(probe, spinner.pid, 1.5)
    assert cpu > 0.0, (cpu, wait)
    assert cpu + wait >= 0.7 * 1.5, (cpu, wait)


def test_gone_pids_and_missing_files_read_as_unavailable(tmp_path: Path) -> None:
    probe = StarvationProbe(proc_root=str(tmp_path), psi_path=str(tmp_path / "pressure" / "cpu"))
    reading = probe.observe([12345])
    assert not reading.available and reading.threads == 0 and reading.run_wait_s == 0.0
    assert reading.psi_some_avg10 is None and reading.reason


def test_fixture_tree_sums_threads_and_falls_back_to_the_process_line(tmp_path: Path) -> None:
    for tid, line in ((10, "1000000000 2000000000 7\n"), (11, "500000000 500000000 3\n"), (12, "garbage\n")):
        d = tmp_path / "10" / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "schedstat").write_text(line)
    (tmp_path / "20").mkdir()  # no task directory (hidepid, permissions): the process's own line
    (tmp_path / "20" / "schedstat").write_text("250000000 750000000 1\n")
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "cpu").write_text(
        "some avg10=26.95 avg60=11.12 avg300=3.02 total=14965897\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    probe = StarvationProbe(proc_root=str(tmp_path), psi_path=str(tmp_path / "pressure" / "cpu"))
    reading = probe.observe([10, 20, 30])
    assert reading.available and reading.threads == 3
    assert reading.run_wait_s == pytest.approx(3.25)
    assert reading.on_cpu_s == pytest.approx(1.75)
    assert reading.psi_some_avg10 == pytest.approx(26.95)
    assert reading.psi_some_total_s == pytest.approx(14.965897)


@pytest.mark.parametrize(
    "text,expected",
    [("1 2 3", (1, 2)), ("1 2", (1, 2)), ("", None), ("x y z", None), ("-1 5 0", None), ("7", None)],
)
def test_parse_schedstat(text: str, expected: tuple[int, int] | None) -> None:
    assert parse_schedstat(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("some avg10=1.50 avg60=0 avg300=0 total=2000000\n", (1.5, 2.0)),
        ("full avg10=3.00 total=1\n", (None, None)),  # only "some" says the host is short of CPU
        ("some avg10=bad total=\n", (None, None)),
        ("", (None, None)),
    ],
)
def test_parse_psi(text: str, expected: tuple[float | None, float | None]) -> None:
    assert parse_psi(text) == expected


def test_the_real_host_reading_is_consistent() -> None:
    reading = StarvationProbe().observe([os.getpid()])
    assert reading.available and reading.threads >= 1 and reading.on_cpu_s > 0
    if Path("/proc/pressure/cpu").exists():
        assert reading.psi_some_avg10 is None or 0.0 <= reading.psi_some_avg10 <= 100.0
