from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from probes.ports import port_accepts, port_is_free
from probes.proctree import ProcessTreeProbe, find_tree, read_stat, title_of
from supervisor.process import (
    MARKER_ENV,
    ServerProcess,
    SpawnError,
    kill_marked,
    resume_stopped,
    send_signal,
    stop_tree,
)
from supervisor.process.signals import signal_member

SpawnFn = Callable[..., ServerProcess]
WaitFn = Callable[..., bool]


def python_argv(code: str, *args: object) -> list[str]:
    return [sys.executable, "-c", code, *(str(a) for a in args)]


# A main process listening on the port with N children named like SGLang's schedulers.
TREE = """
import os, signal, socket, sys, time
import setproctitle
if os.environ.get("T_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
n, port = int(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    if os.fork() == 0:
        setproctitle.setproctitle(f"sglang::scheduler_TP{i}")
        time.sleep(60)
        os._exit(0)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
time.sleep(60)
"""

# The main process's child leaves the session (setsid), forks and exits: the grandchild is
# re-parented, in another session and group, and holds the server port.
ESCAPE = """
import os, socket, sys, time
import setproctitle
port, pidfile = int(sys.argv[1]), sys.argv[2]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        setproctitle.setproctitle("sglang::scheduler_TP0")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        time.sleep(60)
    os._exit(0)
time.sleep(60)
"""

# Ignores SIGTERM and keeps forking children that leave its group.
RESPAWNER = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
for _ in range(200):
    if os.fork() == 0:
        os.setsid()
        time.sleep(60)
        os._exit(0)
    time.sleep(0.03)
time.sleep(60)
"""

SLEEPER = "import time; time.sleep(60)"


def _members_up(root: ServerProcess, marker: str, count: int) -> bool:
    return len(find_tree(root.pid, marker)) >= count


def _alive(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and not st.zombie


def test_spawn_new_session_with_marker(spawn: SpawnFn, marker: str, wait_until: WaitFn) -> None:
    argv = python_argv(SLEEPER)
    proc = spawn(argv)
    # Between fork and exec /proc shows the parent's environment: wait until the program runs.
    assert wait_until(
        lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[:2] == [a.encode() for a in argv[:2]]
    )
    assert os.getsid(proc.pid) == proc.pid
    assert os.getpgid(proc.pid) == proc.pid
    assert os.getsid(proc.pid) != os.getsid(0)
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
    assert f"{MARKER_ENV}={marker}".encode() in environ
    assert b"SPT_NOENV=1" in environ
    assert proc.poll() is None
    assert proc.argv[0] == sys.executable
    assert proc.started_at <= time.monotonic()


def test_spawn_missing_program_names_it() -> None:
    with pytest.raises(SpawnError, match="no-such-sglang-binary"):
        ServerProcess.spawn(["no-such-sglang-binary", "--port", "1"], dict(os.environ), "m")


def test_spawn_bad_cwd_names_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent")
    with pytest.raises(SpawnError, match="absent"):
        ServerProcess.spawn([sys.executable, "-c", "pass"], dict(os.environ), "m", cwd=missing)


def test_spawn_empty_command() -> None:
    with pytest.raises(SpawnError, match="empty"):
        ServerProcess.spawn([], {}, "m")


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs setpriv and root")
def test_spawn_drops_ambient_capabilities(marker: str, repo_root: str) -> None:
    # A daemon holding CAP_SYS_PTRACE as an ambient capability, as the systemd unit gives it.
    code = f"""
import os, sys
from supervisor.process import ServerProcess
amb = [l for l in open('/proc/self/status') if l.startswith('CapAmb')][0].split()[1]
p = ServerProcess.spawn([sys.executable, '-c', "print([l for l in open('/proc/self/status') "
                         "if l.startswith('CapAmb')][0].split()[1])"], dict(os.environ), {marker!r})
print(amb, p.stdout.read().decode().strip(), p.wait(10))
"""
    out = subprocess.run(
        ["setpriv", "--inh-caps", "+sys_ptrace", "--ambient-caps", "+sys_ptrace", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "PYTHONPATH": repo_root},
        check=True,
    ).stdout.split()
    daemon_amb, child_amb, rc = out
    assert int(daemon_amb, 16) != 0
    assert int(child_amb, 16) == 0
    assert rc == "0"


def test_stop_tree_of_schedulers(spawn: SpawnFn, marker: str, free_port: int, wait_until: WaitFn) -> None:
    proc = spawn(python_argv(TREE, 4, free_port))
    want = [f"sglang::scheduler_TP{i}" for i in range(4)]

    def titles() -> list[str]:  # each child sets its title just after its fork: on a loaded host, later
        return sorted(title_of(pid, "") for pid in find_tree(proc.pid, marker) if pid != proc.pid)

    assert wait_until(lambda: _members_up(proc, marker, 5) and port_accepts("127.0.0.1", free_port))
    assert wait_until(lambda: titles() == want), titles()
    members = find_tree(proc.pid, marker)

    grace = 3.0
    report = stop_tree(proc, marker, "127.0.0.1", free_port, grace)

    assert report.ok, report
    assert set(report.pids_found) >= set(members)
    assert set(report.termed) >= set(members)
    assert report.killed == ()
    assert not report.grace_expired
    assert report.exit_code == -signal.SIGTERM
    assert report.duration_s <= grace + 1.0
    assert find_tree(None, marker) == []
    assert port_is_free("127.0.0.1", free_port)


@pytest.mark.integration  # waits out the stop's grace
def test_stop_kills_tree_ignoring_sigterm(spawn: SpawnFn, marker: str, free_port: int, wait_until: WaitFn) -> None:
    proc = spawn(python_argv(TREE, 2, free_port), {"T_IGNORE_TERM": "1"})
    assert wait_until(lambda: _members_up(proc, marker, 3) and port_accepts("127.0.0.1", free_port))
    members = find_tree(proc.pid, marker)

    grace = 1.0
    report = stop_tree(proc, marker, "127.0.0.1", free_port, grace)

    assert report.ok, report
    assert report.grace_expired
    assert set(report.killed) == set(members)
    assert report.survivors == ()
    assert report.exit_code == -signal.SIGKILL
    assert grace <= report.duration_s <= grace + 1.0
    assert not any(_alive(pid) for pid in members)


def test_escaped_descendant_found_by_marker_and_port_freed(
    spawn: SpawnFn, marker: str, free_port: int, tmp_path: Path, wait_until: WaitFn
) -> None:
    pidfile = tmp_path / "escapee"
    proc = spawn(python_argv(ESCAPE, free_port, pidfile))
    assert wait_until(pidfile.exists)
    escapee = int(pidfile.read_text())
    st = read_stat(escapee)
    assert st is not None
    assert st.sid != proc.pid and st.pgid != proc.pid  # left the session and the group
    assert st.ppid != proc.pid  # re-parented
    assert escapee not in find_tree(proc.pid, None)  # not reachable through the parent links
    assert escapee in find_tree(proc.pid, marker)  # only through the marker, despite setproctitle
    assert not port_is_free("127.0.0.1", free_port)

    report = stop_tree(proc, marker, "127.0.0.1", free_port, 2.0)

    assert report.ok, report
    assert escapee in report.termed
    assert not _alive(escapee)
    assert port_is_free("127.0.0.1", free_port)


@pytest.mark.integration  # a tree forking through a real stop
def test_members_forked_during_stop_are_caught(spawn: SpawnFn, marker: str, free_port: int, wait_until: WaitFn) -> None:
    proc = spawn(python_argv(RESPAWNER))
    assert wait_until(lambda: _members_up(proc, marker, 4))
    report = stop_tree(proc, marker, "127.0.0.1", free_port, 0.5)
    assert report.ok, report
    assert len(report.pids_found) >= 4
    assert find_tree(None, marker) == []


def test_processes_not_ours_are_never_signalled(
    spawn: SpawnFn, marker: str, free_port: int, wait_until: WaitFn
) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True)
    neighbour = spawn(python_argv(SLEEPER), other_marker=f"{marker}-other")  # another daemon's server
    try:
        proc = spawn(python_argv(TREE, 1, free_port), {"T_IGNORE_TERM": "1"})
        assert wait_until(lambda: _members_up(proc, marker, 2))
        report = stop_tree(proc, marker, "127.0.0.1", free_port, 0.3)
        assert report.ok, report
        assert stranger.pid not in report.pids_found
        assert neighbour.pid not in report.pids_found
        assert stranger.poll() is None
        assert neighbour.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_reused_pid_is_not_signalled() -> None:
    stranger = subprocess.Popen([sys.executable, "-c", SLEEPER])
    try:
        st = read_stat(stranger.pid)
        assert st is not None
        # The same pid with another start time: a process we once saw, now replaced by a stranger.
        stale = dataclasses.replace(st, starttime=st.starttime - 1)
        assert not signal_member(stale, signal.SIGKILL, "/proc")
        time.sleep(0.1)
        assert stranger.poll() is None
        assert signal_member(st, signal.SIGKILL, "/proc")
        assert stranger.wait(5) == -signal.SIGKILL
    finally:
        stranger.kill()
        stranger.wait()


def test_kill_marked_finds_an_orphaned_tree(spawn: SpawnFn, marker: str, free_port: int, wait_until: WaitFn) -> None:
    # A previous daemon died: its server is no longer anyone's child we hold, only the marker is left.
    proc = spawn(python_argv(TREE, 2, free_port), {"T_IGNORE_TERM": "1"})
    assert wait_until(lambda: _members_up(proc, marker, 3) and port_accepts("127.0.0.1", free_port))
    members = find_tree(proc.pid, marker)
    report = kill_marked(marker, grace_s=0.3, host="127.0.0.1", port=free_port)
    assert report.ok, report
    assert set(report.killed) == set(members)
    assert report.exit_code is None
    assert find_tree(None, marker) == []


def test_kill_marked_with_nothing_left(marker: str) -> None:
    report = kill_marked(marker)
    assert report.ok
    assert report.pids_found == () and report.termed == () and not report.grace_expired


def test_stop_reports_port_held_by_a_stranger(spawn: SpawnFn, marker: str, free_port: int) -> None:
    import socket

    proc = spawn(python_argv(SLEEPER))
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port))
        s.listen()
        report = stop_tree(proc, marker, "127.0.0.1", free_port, 1.0, port_wait_s=0.2)
    assert report.survivors == ()
    assert not report.port_free
    assert os.getpid() in report.port_holders
    assert not report.ok


def test_stop_uses_injected_clock(spawn: SpawnFn, marker: str, free_port: int, wait_until: WaitFn) -> None:
    proc = spawn(python_argv(TREE, 1, free_port), {"T_IGNORE_TERM": "1"})
    assert wait_until(lambda: _members_up(proc, marker, 2))
    now = [100.0]
    sleeps: list[float] = []

    def fake_sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += 1.0  # a slow clock: 30 s of grace pass in 30 polls
        time.sleep(0.01)

    report = stop_tree(proc, marker, "127.0.0.1", free_port, 30.0, sleep=fake_sleep, monotonic=lambda: now[0])
    assert report.ok and report.grace_expired
    assert report.duration_s >= 30.0


def test_resume_stopped(spawn: SpawnFn, wait_until: WaitFn) -> None:
    proc = spawn(python_argv(SLEEPER))
    assert wait_until(lambda: read_stat(proc.pid) is not None)
    os.kill(proc.pid, signal.SIGSTOP)
    assert wait_until(lambda: (st := read_stat(proc.pid)) is not None and st.state == "T")
    assert resume_stopped([proc.pid, 999_999_999]) == [proc.pid]
    assert wait_until(lambda: (st := read_stat(proc.pid)) is not None and st.state in "SR")
    assert resume_stopped([proc.pid]) == []


def test_send_signal() -> None:
    child = subprocess.Popen([sys.executable, "-c", SLEEPER])
    assert send_signal(child.pid, signal.SIGTERM)
    assert child.wait(5) == -signal.SIGTERM
    assert not send_signal(2**30, signal.SIGTERM)  # above any pid_max: no such process


# --- with the SGLang simulator ---------------------------------------------------

SimFn = Callable[..., Any]


def _sim_up(sim: Any, marker: str, schedulers: int) -> bool:
    obs = ProcessTreeProbe().observe(sim.proc.pid, marker)
    return len(obs.by_role("scheduler")) == schedulers and port_accepts("127.0.0.1", sim.port)


@pytest.mark.integration
def test_simulator_tp4_stops_within_grace(simulator: SimFn, marker: str, wait_until: WaitFn) -> None:
    sim = simulator("ok", 4)
    assert wait_until(lambda: _sim_up(sim, marker, 4), timeout=30), sim.logs.tail(20)
    members = find_tree(sim.proc.pid, marker)
    assert len(members) >= 6  # main, 4 schedulers, detokenizer

    grace = 2.0  # the simulated SGLang drains on SIGTERM and may need SIGKILL, as the real one does
    report = stop_tree(sim.proc, marker, "127.0.0.1", sim.port, grace)

    assert report.ok, report
    assert report.duration_s <= grace + 1.0
    assert set(report.pids_found) >= set(members)
    assert find_tree(None, marker) == []
    assert port_is_free("127.0.0.1", sim.port)


@pytest.mark.integration
def test_simulator_ignoring_sigterm_is_killed_after_grace(simulator: SimFn, marker: str, wait_until: WaitFn) -> None:
    sim = simulator("ignore_sigterm", 2)
    assert wait_until(lambda: _sim_up(sim, marker, 2), timeout=30), sim.logs.tail(20)
    grace = 1.0
    report = stop_tree(sim.proc, marker, "127.0.0.1", sim.port, grace)
    assert report.ok, report
    assert report.grace_expired and report.killed
    assert report.exit_code == -signal.SIGKILL
    assert grace <= report.duration_s <= grace + 1.0
    assert find_tree(None, marker) == []


@pytest.mark.integration
def test_simulator_escaped_helper_holding_the_port_is_killed(simulator: SimFn, marker: str, wait_until: WaitFn) -> None:
    sim = simulator("escape_group", 2)

    def escapees() -> list[int]:
        obs = ProcessTreeProbe().observe(sim.proc.pid, marker)
        return [p.pid for p in obs.processes if p.sid != sim.proc.pid and p.status != "zombie"]

    assert wait_until(lambda: escapees() and port_accepts("127.0.0.1", sim.port), timeout=30), sim.logs.tail(20)
    escaped = escapees()  # left the session: SIGTERM to the main process's group misses them

    report = stop_tree(sim.proc, marker, "127.0.0.1", sim.port, 2.0)

    assert report.ok, report
    assert set(escaped) <= set(report.termed) | set(report.killed)
    assert not any(_alive(pid) for pid in escaped)
    assert port_is_free("127.0.0.1", sim.port)
