from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import freeport
import pytest

from probes.ports import PortsProbe, bind_free, connect_host, port_accepts, port_holders, port_is_free
from probes.proctree import find_tree
from probes.types import ListenSocket
from supervisor.process import ServerProcess

SpawnFn = Callable[..., ServerProcess]
WaitFn = Callable[..., bool]

# The main process binds the server port only after a moment ("loading"); a child holds another.
LATE_LISTENER = """
import os, socket, sys, time
port, side_port, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if os.fork() == 0:
    s = socket.socket()
    s.bind(("127.0.0.1", side_port))
    s.listen()
    time.sleep(60)
    os._exit(0)
while not os.path.exists(go):
    time.sleep(0.02)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
time.sleep(60)
"""


def test_listen_sockets_attributed_and_port_accepts_later(
    spawn: SpawnFn, marker: str, free_port: int, tmp_path: Path, wait_until: WaitFn
) -> None:
    side_port = freeport.free_port()  # never the fixture's port
    go = tmp_path / "go"
    proc = spawn([sys.executable, "-c", LATE_LISTENER, str(free_port), str(side_port), str(go)])
    probe = PortsProbe("127.0.0.1", free_port)

    def tree() -> list[int]:
        return find_tree(proc.pid, marker)

    assert wait_until(lambda: len(probe.observe(tree()).listening) == 1)
    before = probe.observe(tree())
    child = next(pid for pid in tree() if pid != proc.pid)
    assert before.listening == (ListenSocket(pid=child, host="127.0.0.1", port=side_port),)
    assert not before.server_port_accepts

    go.touch()
    assert wait_until(lambda: probe.observe(tree()).server_port_accepts)
    after = probe.observe(tree())
    assert ListenSocket(pid=proc.pid, host="127.0.0.1", port=free_port) in after.listening
    assert ListenSocket(pid=child, host="127.0.0.1", port=side_port) in after.listening
    assert port_holders(free_port) == (proc.pid,)
    assert not port_is_free("127.0.0.1", free_port)


def test_sockets_of_other_processes_are_not_reported(free_port: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port))
        s.listen()
        obs = PortsProbe("127.0.0.1", free_port).observe([])
        assert obs.listening == ()
        assert obs.server_port_accepts  # the connect test looks at the port, whoever holds it
        assert PortsProbe("127.0.0.1", free_port).observe([os.getpid()]).listening == (
            ListenSocket(pid=os.getpid(), host="127.0.0.1", port=free_port),
        )


def test_vanished_pids_are_skipped(free_port: int) -> None:
    obs = PortsProbe("127.0.0.1", free_port).observe([2**30])
    assert obs.listening == () and not obs.server_port_accepts


def test_port_is_free_ignores_time_wait_and_sees_any_listener(free_port: int) -> None:
    assert port_is_free("127.0.0.1", free_port)
    assert port_holders(free_port) is None
    # A connection closed by the server side leaves TIME_WAIT: the port is still free for a new server.
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", free_port))
        srv.listen()
        cli = socket.create_connection(("127.0.0.1", free_port))
        conn, _ = srv.accept()
        conn.close()
        cli.close()
    assert port_is_free("127.0.0.1", free_port)
    # A listener on the wildcard address blocks a server on loopback.
    with socket.socket() as wild:
        wild.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        wild.bind(("0.0.0.0", free_port))
        wild.listen()
        assert not bind_free("127.0.0.1", free_port)
        assert not port_is_free("127.0.0.1", free_port)
        assert port_accepts("0.0.0.0", free_port)


def test_connect_host() -> None:
    assert connect_host("0.0.0.0") == "127.0.0.1"
    assert connect_host("::") == "::1"
    assert connect_host("10.0.0.5") == "10.0.0.5"


@pytest.mark.integration
def test_simulator_binds_the_port_once_loaded(simulator: Callable[..., Any], marker: str, wait_until: WaitFn) -> None:
    sim = simulator("ok", 2)
    probe = PortsProbe("127.0.0.1", sim.port)
    first = probe.observe(find_tree(sim.proc.pid, marker))
    assert not first.server_port_accepts  # still "loading"
    assert wait_until(lambda: probe.observe(find_tree(sim.proc.pid, marker)).server_port_accepts, timeout=30)
    obs = probe.observe(find_tree(sim.proc.pid, marker))
    assert any(s.port == sim.port and s.pid == sim.proc.pid for s in obs.listening), obs


def test_the_server_port_is_owned_only_when_the_tree_holds_its_listening_socket() -> None:
    from probes.ports import PortsProbe

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        probe = PortsProbe("127.0.0.1", port)
        mine = probe.observe([os.getpid()])
        assert mine.server_port_accepts and mine.server_port_owned is True
        stranger = subprocess.Popen(["sleep", "30"])
        try:
            theirs = probe.observe([stranger.pid])  # it accepts, but the tree (sleep) does not hold it
            assert theirs.server_port_accepts and theirs.server_port_owned is False
        finally:
            stranger.kill()
            stranger.wait(5)
        gone = probe.observe([stranger.pid])  # no descriptor of the tree readable: unknown, not "no"
        assert gone.server_port_owned is None
