"""What one image of the daemon passes the next across the handoff's exec (supervisor/host/inherit.py):
a real `execv` carries a real listening socket and a real flock, and a descriptor that is not what
its variable says is closed, never used."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.host import inherit
from supervisor.host.instance_lock import LOCK_NAME, StateLock, acquire, adopt


def test_a_variable_for_another_pid_or_malformed_names_nothing() -> None:
    env = {
        inherit.LISTEN_ENV: "pid=1,fd=7,port=8000,host=127.0.0.1",
        inherit.LOCK_ENV: "pid=42,fd=2,dev=1,ino=2",
        inherit.HANDOFF_API_ENV: "127.0.0.1 8000",
        "PATH": "/bin",
    }
    got = inherit.take(env, 42)
    assert env == {"PATH": "/bin"}, "taken out: nothing spawned later sees them"
    assert got.listener is None and got.lock is None
    assert "for pid '1', not this process (42)" in got.ignored[0]
    assert "malformed" in got.ignored[1]  # fd 2 is stderr: never a passed descriptor
    ok = inherit.take({inherit.LISTEN_ENV: "pid=42,fd=7,port=8000,host=::1"}, 42)
    assert ok.listener == inherit.PassedListener(7, "::1", 8000) and ok.ignored == ()
    assert inherit.take({}, 42) == inherit.Inherited()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_listener_for_another_address_or_not_a_listener_is_closed() -> None:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    try:
        fd = os.dup(srv.fileno())
        why = inherit.adopt_listener(inherit.PassedListener(fd, "127.0.0.1", port), "127.0.0.1", port + 1)
        assert isinstance(why, str) and f"127.0.0.1:{port + 1}" in why and not _is_open(fd)
        r, w = os.pipe()
        os.close(w)
        why = inherit.adopt_listener(inherit.PassedListener(r, "127.0.0.1", port), "127.0.0.1", port)
        assert isinstance(why, str) and "not a socket" in why and not _is_open(r)
        idle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # bound, never listening
        idle.bind(("127.0.0.1", 0))
        fd = idle.detach()
        why = inherit.adopt_listener(inherit.PassedListener(fd, "127.0.0.1", port), "127.0.0.1", port)
        assert isinstance(why, str) and "not a TCP socket listening" in why and not _is_open(fd)
        fd = os.dup(srv.fileno())
        os.set_inheritable(fd, True)
        got = inherit.adopt_listener(inherit.PassedListener(fd, "127.0.0.1", port), "127.0.0.1", port)
        assert isinstance(got, socket.socket) and got.fileno() == fd
        assert not got.get_inheritable() and not got.getblocking()  # close-on-exec again
        got.close()
    finally:
        srv.close()


def test_a_lock_descriptor_of_a_replaced_file_is_closed_and_the_lock_taken_afresh(tmp_path: Path) -> None:
    lock = acquire(tmp_path)
    passed = lock.pass_on()
    assert passed is not None and not lock.held
    os.replace(tmp_path / LOCK_NAME, tmp_path / "old.lock")  # another file at the name now
    (tmp_path / LOCK_NAME).write_text("")
    why = adopt(tmp_path, passed)
    assert isinstance(why, str) and "replaced" in why and not _is_open(passed.fd)
    acquire(tmp_path).release()


SECOND = """
import json, os, sys
from pathlib import Path
from supervisor.host import inherit
from supervisor.host.instance_lock import adopt

got = inherit.take(os.environ, os.getpid())
sock = inherit.adopt_listener(got.listener, "127.0.0.1", int(sys.argv[2]))
lock = adopt(Path(sys.argv[1]), got.lock)
report = {
    "pid": os.getpid(),
    "env_left": [k for k in os.environ if k.startswith("SGLANG_SUPERVISOR_")],
    "listener": not isinstance(sock, str) and sock.getsockname()[1],
    "listener_inheritable": not isinstance(sock, str) and sock.get_inheritable(),
    "lock": not isinstance(lock, str) and lock.held,
    "lock_inheritable": not isinstance(lock, str) and os.get_inheritable(got.lock.fd),
}
print(json.dumps(report), flush=True)
conn, _ = sock.accept() if not isinstance(sock, str) else (None, None)
if conn is not None:
    conn.sendall(b"served by the new image")
    conn.close()
sys.stdin.read()  # held until the test is done
"""

FIRST = """
import os, socket, sys
from pathlib import Path
from supervisor.host import inherit
from supervisor.host.instance_lock import acquire

state, port = Path(sys.argv[1]), int(sys.argv[2])
lock = acquire(state)
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", port))
sock.listen(8)
print(os.getpid(), flush=True)
sys.stdin.readline()  # the test connects to this image first
kept = inherit.PassedListener(os.dup(sock.fileno()), "127.0.0.1", port)
sock.close()  # as the API's close does: the duplicate keeps the port
handover = inherit.Handover(kept, lock.pass_on())
os.environ.update(inherit.exec_env(handover, os.getpid()))
os.execv(sys.executable, [sys.executable, "-c", sys.argv[3], str(state), str(port)])
"""


def _locked_by_someone(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.mark.timeout(60)
def test_the_socket_and_the_lock_cross_a_real_exec_and_are_close_on_exec_after(tmp_path: Path) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    code = textwrap.dedent(FIRST)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path), str(port), textwrap.dedent(SECOND)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        pid = int(proc.stdout.readline())
        early = socket.create_connection(("127.0.0.1", port), timeout=10)  # waits in the backlog
        proc.stdin.write("go\n")
        proc.stdin.flush()
        report = json.loads(proc.stdout.readline())
        assert report["pid"] == pid, "the same process, a new image"
        assert report["env_left"] == [], "the variables left the environment before anything could inherit them"
        assert report["listener"] == port and report["lock"] is True
        assert report["listener_inheritable"] is False and report["lock_inheritable"] is False
        assert _locked_by_someone(tmp_path / LOCK_NAME)
        with pytest.raises(OSError):  # the port is still taken: nobody else can bind it
            squat = socket.socket()
            try:
                squat.bind(("127.0.0.1", port))
            finally:
                squat.close()
        early.settimeout(10)
        assert early.recv(100) == b"served by the new image"  # the connection made before the exec
        early.close()
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdin.close()
        proc.stdout.close()
    assert not _locked_by_someone(tmp_path / LOCK_NAME)  # the process gone: the kernel let go


def test_pass_on_hands_the_descriptor_over_once(tmp_path: Path) -> None:
    lock = acquire(tmp_path)
    passed = lock.pass_on()
    assert passed is not None and lock.pass_on() is None
    st = os.stat(tmp_path / LOCK_NAME)
    assert (passed.dev, passed.ino) == (st.st_dev, st.st_ino)
    lock.release()  # no longer this object's: the lock stays
    assert _locked_by_someone(tmp_path / LOCK_NAME)
    again = adopt(tmp_path, passed)
    assert isinstance(again, StateLock) and again.held
    again.release()
    assert not _locked_by_someone(tmp_path / LOCK_NAME)
