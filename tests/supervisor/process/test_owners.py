"""Whose a tree is (supervisor.process.owners) and what the leftovers sweep does with it, with real
processes: a lock holder that is a real process taking the real state-directory lock, trees that
publish (or do not publish) their state directory, a real listening port."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from saying import saying_children

from probes.ports import port_accepts
from probes.proctree import find_tree
from supervisor.daemon.persist import marker_for
from supervisor.host import instance_lock
from supervisor.process import ServerProcess, owners
from supervisor.process.leftovers import kept_on_port, kill_leftovers

SpawnFn = Callable[..., ServerProcess]
WaitFn = Callable[..., bool]
Holder = Callable[[Path], subprocess.Popen[str]]

LISTENER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
time.sleep(60)
"""
HOLDER = """
import sys, time
from pathlib import Path
from supervisor.host.instance_lock import acquire, write_about
d = Path(sys.argv[1])
lock = acquire(d)
write_about(d, Path(sys.argv[2]), ("127.0.0.1", 1), ("127.0.0.1", 2))
print("held", flush=True)
time.sleep(60)
"""
ROOT = str(Path(__file__).resolve().parents[3])


@pytest.fixture
def hold_lock() -> Iterator[Callable[[Path], subprocess.Popen[str]]]:
    """A real process holding `state_dir`'s daemon lock (through instance_lock.acquire)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    with saying_children() as start:
        yield lambda state_dir: start(
            [sys.executable, "-c", HOLDER, str(state_dir), str(state_dir / "my.toml")], "held", env
        )


def test_the_marker_and_the_lock_name_are_the_daemons() -> None:
    for d in (Path("/tmp/x"), Path("relative/dir"), Path("/var/lib/sglang-supervisor")):
        assert owners.marker_of(d) == marker_for(d)
    assert owners.LOCK_NAME == instance_lock.LOCK_NAME and owners.ABOUT_NAME == instance_lock.ABOUT_NAME


def test_the_lock_state_of_a_held_a_free_and_a_missing_lock(tmp_path: Path, hold_lock: Holder) -> None:
    missing = owners.lock_state(tmp_path / "none")
    assert missing.held is None and "does not exist" in missing.why
    holder = hold_lock(tmp_path)
    held = owners.lock_state(tmp_path)
    assert held.held is True and held.pid == holder.pid
    assert owners._proc_locks_holder(os.stat(tmp_path / "daemon.lock"), "/proc") == holder.pid  # no probe needed
    holder.kill()
    holder.wait()
    free = owners.lock_state(tmp_path)
    assert free.held is False and free.pid is None
    instance_lock.acquire(tmp_path).release()  # the probe left the lock takeable


def test_the_probe_works_where_proc_locks_hides_the_holder(tmp_path: Path, hold_lock: Holder) -> None:
    """Another pid namespace's holder is not in /proc/locks: the flock probe still sees it held."""
    fake = tmp_path / "proc"
    fake.mkdir()
    (fake / "locks").write_text("")
    state = tmp_path / "state"
    holder = hold_lock(state)
    held = owners.lock_state(state, proc_root=str(fake))
    assert held.held is True and held.pid == holder.pid  # from the lock file's text


def _tree(spawn: SpawnFn, port: int, marker: str, state_dir: Path | None) -> ServerProcess:
    env = {owners.STATE_DIR_ENV: str(state_dir)} if state_dir is not None else {}
    return spawn([sys.executable, "-c", LISTENER, str(port)], env, other_marker=marker)


def test_a_live_daemons_tree_on_the_port_is_kept_and_named(
    spawn: SpawnFn, marker: str, free_port: int, wait_until: WaitFn, tmp_path: Path, hold_lock: Holder
) -> None:
    other = (tmp_path / "other").resolve()
    holder = hold_lock(other)
    tree = _tree(spawn, free_port, owners.marker_of(other), other)
    try:
        assert wait_until(lambda: port_accepts("127.0.0.1", free_port))
        report = kill_leftovers((marker,), "127.0.0.1", free_port, grace_s=0.5)
        assert tree.pid not in report.pids_found and tree.poll() is None  # never signalled
        why = kept_on_port(free_port, (marker,))
        assert why is not None
        assert f"pid {holder.pid}" in why and str(other) in why and str(other / "my.toml") in why
        assert f"port {free_port}" in why
    finally:
        os.killpg(tree.pid, 9)


def test_a_dead_daemons_tree_on_the_port_is_stopped(
    spawn: SpawnFn, marker: str, free_port: int, wait_until: WaitFn, tmp_path: Path, hold_lock: Holder
) -> None:
    other = (tmp_path / "other").resolve()
    holder = hold_lock(other)
    tree = _tree(spawn, free_port, owners.marker_of(other), other)
    holder.kill()
    holder.wait()  # SIGKILLed: the kernel freed its lock, its tree is left
    assert wait_until(lambda: port_accepts("127.0.0.1", free_port))
    assert kept_on_port(free_port, (marker,)) is None
    report = kill_leftovers((marker,), "127.0.0.1", free_port, grace_s=0.5)
    assert tree.pid in report.pids_found and report.port_free
    assert wait_until(lambda: tree.poll() is not None)


def test_a_tree_whose_daemon_cannot_be_found_is_kept(
    spawn: SpawnFn, marker: str, free_port: int, wait_until: WaitFn, tmp_path: Path
) -> None:
    """No published state directory (an older version, or by hand), or one that does not hash to
    the marker: nothing proves whose it is, so it is not stopped and the launch names it."""
    for published in (None, tmp_path):
        lost = f"test-lost-{uuid.uuid4().hex[:8]}"
        tree = _tree(spawn, free_port, lost, published)
        try:
            assert wait_until(lambda: port_accepts("127.0.0.1", free_port))
            report = kill_leftovers((marker,), "127.0.0.1", free_port, grace_s=0.5, port_wait_s=0.2)
            assert tree.pid not in report.pids_found and tree.poll() is None
            why = kept_on_port(free_port, (marker,))
            assert why is not None and f"pid {tree.pid}" in why and "cannot be found" in why
        finally:
            os.killpg(tree.pid, 9)
            tree.wait(5)
        assert wait_until(lambda: not port_accepts("127.0.0.1", free_port))


def test_a_tree_of_this_state_directory_with_an_older_marker_is_stopped(
    spawn: SpawnFn, free_port: int, wait_until: WaitFn, tmp_path: Path
) -> None:
    """A lost state.json loses the saved marker, not the tree: it publishes this state directory."""
    lost = f"test-lost-{uuid.uuid4().hex[:8]}"
    tree = _tree(spawn, free_port, lost, tmp_path)
    assert wait_until(lambda: port_accepts("127.0.0.1", free_port))
    report = kill_leftovers((owners.marker_of(tmp_path),), "127.0.0.1", free_port, grace_s=0.5)
    assert tree.pid in report.pids_found and report.port_free
    assert wait_until(lambda: tree.poll() is not None) and find_tree(None, lost) == []


def test_live_daemons_are_found_from_their_lock(tmp_path: Path, hold_lock: Holder) -> None:
    holder = hold_lock(tmp_path.resolve())
    found = [d for d in owners.live_daemons() if d["pid"] == holder.pid]
    assert found and found[0]["state_dir"] == str(tmp_path.resolve()) and found[0]["server_port"] == 1
    holder.kill()
    holder.wait()
    assert not [d for d in owners.live_daemons() if d["pid"] == holder.pid]
