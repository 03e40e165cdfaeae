from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from probes.proctree import (
    MARKER_ENV,
    ProcessTreeProbe,
    find_tree,
    parse_io,
    parse_stat,
    role_of,
    scan_tree,
)
from supervisor.process import ServerProcess

SpawnFn = Callable[..., ServerProcess]
WaitFn = Callable[..., bool]
TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

# Fixture pids above any pid_max, so they can never be the test process or its ancestors.
ROOT, TP0, TP1, DETOK, ZOMBIE, ESCAPED, ESC_CHILD, STRANGER, STRANGER_CHILD = (
    5_000_100,
    5_000_101,
    5_000_102,
    5_000_103,
    5_000_150,
    5_000_200,
    5_000_201,
    5_000_300,
    5_000_301,
)


def _stat(pid: int, comm: str, state: str, ppid: int, pgid: int, sid: int, utime: int, stime: int, threads: int) -> str:
    rest = [state, ppid, pgid, sid, 34816, pgid, 4194560, 100, 0, 5, 0, utime, stime, 0, 0, 20, 0, threads, 0]
    rest += [12345 + pid % 1000, 1 << 30, 2560, 18446744073709551615]  # starttime, vsize, rss pages, rsslim
    return f"{pid} ({comm}) " + " ".join(str(x) for x in rest) + " 0" * 29 + "\n"


def _write_proc(
    root: Path,
    pid: int,
    *,
    comm: str,
    ppid: int,
    cmdline: bytes = b"",
    environ: bytes = b"PATH=/usr/bin\0",
    state: str = "S",
    sid: int = ROOT,
    pgid: int = ROOT,
    ticks: tuple[int, int] = (10, 5),
    io: str | None = "rchar: 1000\nwchar: 200\nsyscr: 5\nsyscw: 2\nread_bytes: 0\nwrite_bytes: 0\n",
    threads: tuple[tuple[int, str, str, str], ...] = (),
) -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "stat").write_text(_stat(pid, comm, state, ppid, pgid, sid, *ticks, max(1, len(threads))))
    (d / "cmdline").write_bytes(cmdline)
    (d / "environ").write_bytes(environ)
    if io is not None:
        (d / "io").write_text(io)
    (d / "task").mkdir()
    for tid, name, tstate, wchan in threads:
        t = d / "task" / str(tid)
        t.mkdir()
        (t / "stat").write_text(_stat(tid, name, tstate, ppid, pgid, sid, 1, 1, 1))
        (t / "comm").write_text(name + "\n")
        (t / "wchan").write_text(wchan)


@pytest.fixture
def fake_proc(tmp_path: Path) -> str:
    proc = tmp_path / "proc"
    proc.mkdir()
    mark = f"{MARKER_ENV}=m1\0".encode()
    other = f"{MARKER_ENV}=other\0".encode()
    python = b"python3\0-m\0sglang.launch_server\0--tp-size\x002\0"
    # setproctitle pads the argv area with NULs
    _write_proc(
        proc,
        ROOT,
        comm="python3",
        ppid=1,
        cmdline=python,
        environ=b"A=1\0" + mark,
        ticks=(100, 50),
        threads=(
            (ROOT, "python3", "S", "do_epoll_wait"),
            (ROOT + 10_000, "uvicorn worker", "S", "futex_do_wait"),
        ),
    )
    tp0_threads = ((TP0, "sglang::schedul", "R", "0"), (TP0 + 10_000, "pt_nccl_watchdg", "S", "futex_do_wait"))
    _write_proc(
        proc, TP0, comm="sglang::schedul", ppid=ROOT, cmdline=b"sglang::scheduler_TP0" + b"\0" * 40, threads=tp0_threads
    )
    # The environment was overwritten by setproctitle: found through its parent only.
    _write_proc(proc, TP1, comm="sglang::schedul", ppid=ROOT, cmdline=b"sglang::scheduler_TP1\0\0", environ=b"\0" * 64)
    _write_proc(proc, DETOK, comm="sglang::detoken", ppid=ROOT, cmdline=b"sglang::detokenizer\0", io=None)
    _write_proc(proc, ZOMBIE, comm="python3 (worker)", ppid=ROOT, state="Z", environ=b"")
    _write_proc(
        proc,
        ESCAPED,
        comm="python3",
        ppid=1,
        cmdline=b"sglang::scheduler_TP7\0",
        environ=mark,
        sid=ESCAPED,
        pgid=ESCAPED,
    )
    _write_proc(proc, ESC_CHILD, comm="sleep", ppid=ESCAPED, cmdline=b"sleep\x0060\0", environ=b"", sid=ESCAPED)
    _write_proc(proc, STRANGER, comm="python3", ppid=1, environ=other, sid=STRANGER, pgid=STRANGER)
    _write_proc(proc, STRANGER_CHILD, comm="bash", ppid=STRANGER, environ=b"", sid=STRANGER, pgid=STRANGER)
    _write_proc(proc, 1, comm="init", ppid=0, sid=1, pgid=1)
    (proc / "5000999").mkdir()  # vanished between listdir and open: no files
    (proc / "5000998").mkdir()
    (proc / "5000998" / "stat").write_text("garbage")
    (proc / "self").mkdir()
    return str(proc)


def test_parse_stat_with_odd_comm() -> None:
    st = parse_stat(42, _stat(42, "a (b) c)", "D", 7, 8, 9, 300, 200, 3))
    assert st is not None
    assert (st.comm, st.state, st.ppid, st.pgid, st.sid, st.num_threads) == ("a (b) c)", "D", 7, 8, 9, 3)
    assert st.cpu_time_s == pytest.approx(500 / TCK)
    assert parse_stat(42, "42 (x") is None
    assert parse_stat(42, "42 (x) S 1") is None


def test_parse_io() -> None:
    assert parse_io("rchar: 10\nwchar: 20\nread_bytes: 4096\n") == (10, 20)
    assert parse_io("") == (0, 0)


@pytest.mark.parametrize(
    ("title", "is_root", "expected"),
    [
        ("python3 -m sglang.launch_server", True, ("main", None)),
        ("sglang::scheduler_TP3", False, ("scheduler", 3)),
        ("sglang::scheduler_DP1_TP12", False, ("scheduler", 12)),
        ("sglang::scheduler", False, ("scheduler", 0)),  # tp-size 1: no rank suffix
        ("sglang::scheduler_DP1", False, ("scheduler", 0)),
        ("sglang::detokenizer", False, ("detokenizer", None)),
        ("sglang::data_parallel_controller", False, ("controller", None)),
        ("python3 -c from multiprocessing.resource_tracker import main", False, ("other", None)),
    ],
)
def test_role_of(title: str, is_root: bool, expected: tuple[str, int | None]) -> None:
    assert role_of(title, is_root) == expected


SPAWN = (
    "/usr/bin/python3 -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)"
    " --multiprocessing-fork"
)
LAUNCH = "python3 -m sglang.launch_server --model-path /m"


@pytest.mark.parametrize(
    ("title", "root_title", "expected"),
    [
        (SPAWN, LAUNCH, ("pending", None)),  # spawned, still importing SGLang
        (SPAWN, None, ("pending", None)),
        (LAUNCH, LAUNCH, ("pending", None)),  # still carries its parent's command line
        (LAUNCH, None, ("other", None)),  # not a child of the main process: nothing to compare
        ("sleep 60", LAUNCH, ("other", None)),
        ("python3 -c from multiprocessing.resource_tracker import main;main(5)", LAUNCH, ("other", None)),
        ("sglang::scheduler", LAUNCH, ("scheduler", 0)),
    ],
)
def test_role_of_children_before_their_titles(
    title: str, root_title: str | None, expected: tuple[str, int | None]
) -> None:
    assert role_of(title, False, root_title) == expected


def test_observe_children_that_have_not_named_themselves(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    launch = b"python3\0-m\0sglang.launch_server\0--model-path\0/m\0"
    _write_proc(proc, ROOT, comm="python3", ppid=1, cmdline=launch)
    _write_proc(proc, TP0, comm="python3", ppid=ROOT, cmdline=SPAWN.replace(" -c ", "\0-c\0").encode() + b"\0")
    _write_proc(proc, TP1, comm="python3", ppid=ROOT, cmdline=launch)  # parent's argv, title not set yet
    _write_proc(proc, DETOK, comm="sleep", ppid=TP1, cmdline=launch)  # a grandchild: not the main's child
    obs = ProcessTreeProbe(str(proc)).observe(ROOT, None)
    assert [(p.pid, p.role) for p in obs.processes] == [
        (ROOT, "main"),
        (TP0, "pending"),
        (TP1, "pending"),
        (DETOK, "other"),
    ]


def _uptime(proc: str, seconds_after_start: float, start: int = 12345 + 301) -> None:
    """/proc/uptime `seconds_after_start` after the clock tick `start` (the fixture's start times)."""
    Path(proc, "uptime").write_text(f"{start / TCK + seconds_after_start:.2f} 100.00\n")


def test_a_settled_process_without_the_marker_is_not_read_again(fake_proc: str) -> None:
    """Issue 51: the marker search read every process's environment at every poll. A process already
    2 s old whose environment lacked the marker is noted and skipped; an exec is the only way its
    environment changes, and an exec follows its fork at once."""
    _uptime(fake_proc, 10.0)
    notes: set[tuple[int, int]] = set()
    first = scan_tree(None, "m1", fake_proc, unmarked=notes)
    assert list(first) == [ROOT, TP0, TP1, DETOK, ZOMBIE, ESCAPED, ESC_CHILD]
    assert (STRANGER, 12345 + STRANGER % 1000) in notes and (STRANGER_CHILD, 12345 + STRANGER_CHILD % 1000) not in notes
    Path(fake_proc, str(STRANGER), "environ").write_bytes(f"{MARKER_ENV}=m1\0".encode())
    assert scan_tree(None, "m1", fake_proc, unmarked=notes) == first  # noted: not read again
    assert STRANGER in scan_tree(None, "m1", fake_proc)  # without the notes it is read, and found
    # A process gone from /proc leaves the notes (its pid may come back as another process).
    Path(fake_proc, str(STRANGER), "stat").unlink()
    scan_tree(None, "m1", fake_proc, unmarked=notes)
    assert all(pid != STRANGER for pid, _ in notes)


def test_a_young_process_is_read_at_every_scan(fake_proc: str) -> None:
    _uptime(fake_proc, 1.0, start=12345)  # every process started under 2 s ago: it may still exec with the marker
    notes: set[tuple[int, int]] = set()
    scan_tree(None, "m1", fake_proc, unmarked=notes)
    assert notes == set()
    Path(fake_proc, str(STRANGER), "environ").write_bytes(f"{MARKER_ENV}=m1\0".encode())
    assert STRANGER in scan_tree(None, "m1", fake_proc, unmarked=notes)


def test_find_tree_by_parentage_and_marker(fake_proc: str) -> None:
    tree = [ROOT, TP0, TP1, DETOK, ZOMBIE]
    assert find_tree(ROOT, None, fake_proc) == tree
    assert find_tree(ROOT, "m1", fake_proc) == sorted([*tree, ESCAPED, ESC_CHILD])
    assert find_tree(None, "m1", fake_proc) == [ROOT, TP0, TP1, DETOK, ZOMBIE, ESCAPED, ESC_CHILD]
    assert find_tree(None, "other", fake_proc) == [STRANGER, STRANGER_CHILD]
    assert find_tree(None, "m", fake_proc) == []  # a prefix of a marker is not the marker
    assert find_tree(None, None, fake_proc) == []
    assert find_tree(4_999_999, None, fake_proc) == []  # root already gone


def test_scan_tree_keeps_known_members_whose_marker_is_hidden(fake_proc: str) -> None:
    # After the root is reaped, TP1 (no marker visible) is still ours because we saw it before.
    start = scan_tree(ROOT, None, fake_proc)[TP1].starttime
    assert TP1 in scan_tree(None, "m1", fake_proc, known={TP1: start})
    assert TP1 not in scan_tree(None, "nothing", fake_proc, known={TP1: start + 1})  # pid reused


def test_observe_fixture_tree(fake_proc: str) -> None:
    obs = ProcessTreeProbe(fake_proc).observe(ROOT, "m1", root_exit=None)
    by_pid = {p.pid: p for p in obs.processes}
    assert sorted(by_pid) == sorted([ROOT, TP0, TP1, DETOK, ZOMBIE, ESCAPED, ESC_CHILD])
    assert obs.root_alive and obs.root_pid == ROOT and obs.root_exit is None

    root = by_pid[ROOT]
    assert root.role == "main" and root.title == "python3 -m sglang.launch_server --tp-size 2"
    assert root.cpu_time_s == pytest.approx(150 / TCK)
    assert root.rss_bytes == 2560 * PAGE
    assert (root.read_chars, root.write_chars) == (1000, 200)
    assert root.num_threads == 2
    assert [(t.name, t.state, t.wchan) for t in root.threads] == [
        ("python3", "S", "do_epoll_wait"),
        ("uvicorn worker", "S", "futex_do_wait"),
    ]
    assert (root.sid, root.pgid, root.ppid, root.status) == (ROOT, ROOT, 1, "sleeping")

    assert [(p.role, p.rank) for p in obs.by_role("scheduler")] == [
        ("scheduler", 0),
        ("scheduler", 1),
        ("scheduler", 7),
    ]
    assert by_pid[TP0].title == "sglang::scheduler_TP0"
    assert by_pid[TP0].threads[0].state == "R" and by_pid[TP0].threads[1].wchan == "futex_do_wait"
    assert by_pid[DETOK].role == "detokenizer" and by_pid[DETOK].read_chars == 0  # io unreadable
    zombie = by_pid[ZOMBIE]
    assert zombie.status == "zombie" and zombie.title == "python3 (worker)"  # no cmdline: comm
    assert by_pid[ESCAPED].sid == ESCAPED

    assert obs.cpu_time_s == pytest.approx(sum(p.cpu_time_s for p in obs.processes))
    assert obs.rss_bytes == sum(p.rss_bytes for p in obs.processes)
    assert obs.read_chars == 1000 * 6  # every member but the detokenizer


def test_observe_root_gone(fake_proc: str) -> None:
    obs = ProcessTreeProbe(fake_proc).observe(4_999_999, "m1", root_exit=-9)
    assert not obs.root_alive and obs.root_exit == -9
    assert ESCAPED in obs.pids and ROOT in obs.pids  # marker members outlive the main process


def test_observe_without_threads(fake_proc: str) -> None:
    obs = ProcessTreeProbe(fake_proc, with_threads=False).observe(ROOT, None)
    assert all(p.threads == () for p in obs.processes)
    assert next(p for p in obs.processes if p.pid == ROOT).num_threads == 2


def test_observe_nothing() -> None:
    obs = ProcessTreeProbe().observe(None, None)
    assert obs.processes == () and not obs.root_alive and obs.cpu_time_s == 0


# --- real processes ------------------------------------------------------------

SGLANG_LIKE = """
import os, threading, time
import setproctitle
lock = threading.Lock()
lock.acquire()
titles = [f"sglang::scheduler_TP{i}" for i in range(3)] + ["sglang::detokenizer"]
for title in titles:
    if os.fork() == 0:
        setproctitle.setproctitle(title)
        threading.Thread(target=lock.acquire, name="blocked").start()  # a thread in a futex wait
        time.sleep(60)
        os._exit(0)
time.sleep(60)
"""

BUSY_READER = """
import sys, time
path = sys.argv[1]
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    with open(path, "rb") as f:
        while f.read(1 << 16):
            pass
"""


def test_roles_ranks_and_thread_states_of_a_real_tree(spawn: SpawnFn, marker: str, wait_until: WaitFn) -> None:
    proc = spawn([sys.executable, "-c", SGLANG_LIKE])
    probe = ProcessTreeProbe()

    def titled() -> bool:
        obs = probe.observe(proc.pid, marker)
        return len(obs.by_role("scheduler")) == 3 and len(obs.by_role("detokenizer")) == 1

    assert wait_until(titled)
    time.sleep(0.2)
    t0 = time.perf_counter()
    obs = probe.observe(proc.pid, marker)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0  # one /proc walk of a 5-process tree; generous for a loaded CI machine
    assert obs.root_alive and obs.by_role("main")[0].pid == proc.pid
    assert sorted(p.rank for p in obs.by_role("scheduler")) == [0, 1, 2]  # type: ignore[type-var]
    for p in obs.by_role("scheduler"):
        assert p.ppid == proc.pid and p.sid == proc.pid and p.pgid == proc.pid
        assert p.num_threads == 2 == len(p.threads)
        blocked = next(t for t in p.threads if t.tid != p.pid)  # Python 3.10-3.13 leave OS thread names alone
        assert blocked.state == "S"
        assert "futex" in blocked.wchan
        assert p.rss_bytes > 1 << 20


def test_cpu_time_and_read_chars_rise(spawn: SpawnFn, marker: str, tmp_path: Path, wait_until: WaitFn) -> None:
    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(1 << 20))
    proc = spawn([sys.executable, "-c", BUSY_READER, str(data)])
    probe = ProcessTreeProbe()
    assert wait_until(lambda: probe.observe(proc.pid, marker).read_chars > 1 << 20)
    first = probe.observe(proc.pid, marker)
    # Polled rather than slept: on a loaded 2-core machine the child may get little CPU.
    assert wait_until(lambda: probe.observe(proc.pid, marker).cpu_time_s - first.cpu_time_s >= 0.1)
    assert wait_until(lambda: probe.observe(proc.pid, marker).read_chars - first.read_chars >= 10 << 20)
    assert probe.observe(proc.pid, marker).processes[0].status in ("running", "sleeping", "disk-sleep")


def _sleeping(wchan: str) -> bool:
    # time.sleep is clock_nanosleep from Python 3.11 on, select() before
    return wchan == "hrtimer_nanosleep" or wchan.startswith("poll_schedule_timeout")


def test_idle_child_cpu_time_stays_flat(spawn: SpawnFn, marker: str, wait_until: WaitFn) -> None:
    proc = spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    probe = ProcessTreeProbe()
    assert wait_until(lambda: _sleeping(probe.observe(proc.pid, marker).processes[0].threads[0].wchan))
    first = probe.observe(proc.pid, marker)
    time.sleep(0.3)
    second = probe.observe(proc.pid, marker)
    assert second.cpu_time_s - first.cpu_time_s < 0.05
    assert second.processes[0].threads[0].state == "S"


@pytest.mark.integration
def test_simulator_roles_and_ranks(simulator: Callable[..., Any], marker: str, wait_until: WaitFn) -> None:
    sim = simulator("ok", 4)
    probe = ProcessTreeProbe()
    assert wait_until(lambda: len(probe.observe(sim.proc.pid, marker).by_role("scheduler")) == 4, timeout=30)
    obs = probe.observe(sim.proc.pid, marker)
    assert [p.pid for p in obs.by_role("main")] == [sim.proc.pid]
    assert sorted(p.rank for p in obs.by_role("scheduler")) == [0, 1, 2, 3]  # type: ignore[type-var]
    assert len(obs.by_role("detokenizer")) == 1
    assert all(p.title.startswith("sglang::") for p in obs.processes if p.role in ("scheduler", "detokenizer"))
    assert obs.cpu_time_s > 0 and obs.rss_bytes > 0 and obs.read_chars > 0
    assert all(t.state for p in obs.processes for t in p.threads)


def test_a_title_padded_with_spaces_is_stripped(tmp_path: Path) -> None:
    # Real SGLang 0.5.16's children: setproctitle filled the old argv area with spaces, no NUL.
    proc = tmp_path / "proc"
    proc.mkdir()
    _write_proc(proc, ROOT, comm="python3", ppid=1, cmdline=b"python3\0-m\0sglang.launch_server\0")
    _write_proc(proc, TP0, comm="sglang::schedul", ppid=ROOT, cmdline=b"sglang::scheduler" + b" " * 120)
    obs = ProcessTreeProbe(str(proc)).observe(ROOT, None)
    tp0 = next(p for p in obs.processes if p.pid == TP0)
    assert (tp0.title, tp0.role, tp0.rank) == ("sglang::scheduler", "scheduler", 0)
