"""supervisor.logs.tending: what the daemon says about the log keeper, and the replacement on the same pipe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from supervisor.logs.tending import Keeper, KeeperStatus, find_keeper, open_read_end, pipe_fill, tend


def test_a_stopped_keeper_is_named_with_the_pipe_fill() -> None:
    full = KeeperStatus("stopped", 7, pipe_bytes=915_063, pipe_size=1 << 20)
    assert full.pipe_full and "pid 7" in full.describe() and "server blocks" in full.describe()
    part = KeeperStatus("stopped", 7, pipe_bytes=10, pipe_size=1 << 20)
    assert not part.pipe_full and "holding 10 of" in part.describe()
    assert KeeperStatus("running", 7, pipe_bytes=1 << 20, pipe_size=1 << 20).describe() == ""


def _writer_and_reader() -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    r, w = os.pipe()
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=w)
    reader = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(60)", "supervisor.logs.keeper"], stdin=r
    )
    os.close(r)
    os.close(w)
    deadline = time.monotonic() + 10  # until both have exec'd (a loaded machine forks slowly)
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{reader.pid}/cmdline", "rb") as f:
                if b"supervisor.logs.keeper" in f.read():
                    break
        except OSError:
            pass
        time.sleep(0.01)
    return writer, reader


def _wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.01)


def test_the_pipe_is_found_through_proc_and_a_dead_reader_is_replaced_on_it() -> None:
    writer, reader = _writer_and_reader()
    replacement: list[subprocess.Popen[bytes]] = []
    try:
        fd = open_read_end(writer.pid)
        assert fd is not None
        found = find_keeper(fd)
        assert found is not None and found[0] == reader.pid
        k = Keeper(writer.pid, fd, *found)
        assert tend(k, lambda: True, lambda _: (_ for _ in ()).throw(AssertionError())).condition == "running"
        assert pipe_fill(fd)[1] is not None

        reader.send_signal(signal.SIGSTOP)
        _wait_stopped(reader.pid)
        assert tend(k, lambda: True, lambda _: (_ for _ in ()).throw(AssertionError())).condition == "stopped"
        reader.kill()
        reader.wait(5)

        def respawn(read_fd: int) -> subprocess.Popen[bytes]:
            p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.buffer.read()"], stdin=read_fd)
            replacement.append(p)
            return p

        st = tend(k, lambda: True, respawn)
        assert st.condition == "replaced" and st.old_pid == reader.pid and st.pid == replacement[0].pid
        assert os.readlink(f"/proc/{replacement[0].pid}/fd/0") == os.readlink(f"/proc/{writer.pid}/fd/1")
        k.close()
    finally:
        for p in (writer, reader, *replacement):
            p.kill()
            p.wait(5)


def test_nothing_is_replaced_for_a_server_that_is_gone_or_a_fd_that_is_no_pipe() -> None:
    k = Keeper(server_pid=1, read_fd=None, pid=None, starttime=None)
    assert tend(k, lambda: False, lambda _: (_ for _ in ()).throw(AssertionError())).condition == "none"
    lost = tend(k, lambda: True, lambda _: (_ for _ in ()).throw(AssertionError()))
    assert lost.condition == "lost"
    quiet = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL)
    try:
        assert open_read_end(quiet.pid) is None  # its output is /dev/null, not a pipe
    finally:
        quiet.kill()
        quiet.wait(5)
