"""Listening sockets owned by the tree, and whether the server port accepts a connection."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable

import psutil

from probes.types import ListenSocket, PortsObservation

CONNECT_TIMEOUT_S = 0.2


def connect_host(host: str) -> str:
    """Where to connect for a server bound to `host`: a wildcard address means loopback."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def listening_sockets(pids: Iterable[int]) -> tuple[ListenSocket, ...]:
    found: set[ListenSocket] = set()
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN and conn.laddr:
                found.add(ListenSocket(pid=pid, host=conn.laddr.ip, port=conn.laddr.port))
    return tuple(sorted(found, key=lambda s: (s.pid, s.port, s.host)))


def port_accepts(host: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    try:
        with socket.create_connection((connect_host(host), port), timeout=timeout_s):
            return True
    except OSError:
        return False


class PortsProbe:
    """Blocking (a connect of at most `timeout_s`): call it from a worker thread."""

    def __init__(self, host: str, port: int, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self._host = host
        self._port = port
        self._timeout_s = timeout_s

    def observe(self, pids: Iterable[int]) -> PortsObservation:
        return PortsObservation(
            listening=listening_sockets(pids),
            server_port_accepts=port_accepts(self._host, self._port, self._timeout_s),
        )


def port_holders(port: int) -> tuple[int, ...] | None:
    """Pids with a TCP socket listening on `port`; None when no one listens, () when the owner is hidden."""
    holders: set[int] = set()
    listening = False
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            listening = True
            if conn.pid is not None:
                holders.add(conn.pid)
    return tuple(sorted(holders)) if listening else None


def bind_free(host: str, port: int) -> bool:
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return True  # unresolvable: the LISTEN check alone decides
    family, socktype, proto, _, addr = infos[0]
    with socket.socket(family, socktype, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            return e.errno != errno.EADDRINUSE
    return True


def port_is_free(host: str, port: int) -> bool:
    """A bind with SO_REUSEADDR succeeds (TIME_WAIT does not count) and no socket listens on the port."""
    return bind_free(host, port) and port_holders(port) is None
