"""The state directory's lock: one holder, named to whoever is refused; a handoff is waited for, bounded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.host.instance_lock import Holder, StateDirLocked, StateDirUnusable, acquire, parse_holder


@pytest.mark.parametrize(
    ("text", "holder"),
    [
        ("123\n", Holder(123, False)),
        ("123 handoff\n", Holder(123, True)),
        ("", Holder(None, False)),
        ("garbage handoff", Holder(None, True)),
        ("99999999999999999999", Holder(None, False)),
        ("\x00\x01", Holder(None, False)),
    ],
)
def test_what_the_lock_file_says_about_its_holder(text: str, holder: Holder) -> None:
    assert parse_holder(text) == holder


def test_a_second_taker_is_refused_at_once_with_the_holders_pid(tmp_path: Path) -> None:
    first = acquire(tmp_path)
    waits: list[float] = []
    with pytest.raises(StateDirLocked, match=rf"pid {os.getpid()}\b") as err:
        acquire(tmp_path, sleep=waits.append)
    assert waits == [] and "state_dir" in str(err.value)
    first.release()
    again = acquire(tmp_path)  # released: the next one gets it
    again.release()


def test_a_holder_that_announced_a_handoff_is_waited_for_then_refused(tmp_path: Path) -> None:
    first = acquire(tmp_path)
    first.announce_handoff()
    clock = [0.0]
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        clock[0] += s

    with pytest.raises(StateDirLocked, match="pid"):
        acquire(tmp_path, handoff_wait_s=1.0, sleep=sleep, monotonic=lambda: clock[0])
    assert 0.9 <= sum(waits) <= 1.1  # bounded: it waited, then gave up
    waits.clear()

    def release_later(s: float) -> None:
        waits.append(s)
        if len(waits) == 3:
            first.release()

    lock = acquire(tmp_path, handoff_wait_s=1.0, sleep=release_later, monotonic=lambda: 0.0)
    assert lock.held and len(waits) == 3
    assert (tmp_path / "daemon.lock").read_text() == f"{os.getpid()}\n"
    lock.release()


def test_a_killed_holder_leaves_no_lock_and_children_never_inherit_it(tmp_path: Path) -> None:
    code = (
        "import sys, subprocess, time; from pathlib import Path; from supervisor.host.instance_lock import acquire\n"
        f"lock = acquire(Path({str(tmp_path)!r}))\n"
        "child = subprocess.Popen(['sleep', '60'], close_fds=False)\n"
        "print(child.pid, flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    child = int(holder.stdout.readline())
    try:
        with pytest.raises(StateDirLocked, match=f"pid {holder.pid}"):
            acquire(tmp_path)
        holder.kill()
        holder.wait(10)
        lock = acquire(tmp_path)  # the orphaned child (close_fds=False even) does not hold it
        lock.release()
    finally:
        os.kill(child, 9)
        holder.stdout.close()


def test_an_unusable_state_dir_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StateDirUnusable, match=r"cannot use the state directory: .*\[paths\] state_dir"):
        acquire(blocker / "state")
