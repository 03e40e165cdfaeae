"""Listening sockets owned by the tree, and whether the server port accepts a connection."""

from __future__ import annotations

import errno
import os
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


_TCP_LISTEN = "0A"


def _socket_inodes(pid: int, proc_root: str) -> set[int]:
    fd_dir = f"{proc_root}/{pid}/fd"
    inodes: set[int] = set()
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _hex_ip(text: str) -> str:
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # IPv6: four 32-bit words, each in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def _listen_table(pid: int, proc_root: str) -> dict[int, tuple[str, int]]:
    """inode -> (ip, port) of the LISTEN sockets in `pid`'s network namespace."""
    table: dict[int, tuple[str, int]] = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc_root}/{pid}/net/{name}") as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) < 10 or cols[3] != _TCP_LISTEN:
                        continue
                    ip, port = cols[1].rsplit(":", 1)
                    try:
                        table[int(cols[9])] = (_hex_ip(ip), int(port, 16))
                    except ValueError:
                        continue
        except OSError:
            continue
    return table


def listening_sockets(pids: Iterable[int], proc_root: str = "/proc") -> tuple[ListenSocket, ...]:
    """LISTEN sockets held by `pids`.

    Reads the namespace's socket tables once per poll and each member's fd links, instead of
    psutil's per-process scan that re-reads the whole table for every member (~2 ms each).
    """
    owners: dict[int, int] = {}
    namespaces: dict[int, int] = {}  # net namespace inode -> a member to read its tables through
    for pid in pids:
        for inode in _socket_inodes(pid, proc_root):
            owners.setdefault(inode, pid)
        try:
            namespaces.setdefault(os.stat(f"{proc_root}/{pid}/ns/net").st_ino, pid)
        except OSError:
            continue
    if not owners:
        return ()
    found: set[ListenSocket] = set()
    for reader in namespaces.values():
        for inode, (ip, port) in _listen_table(reader, proc_root).items():
            owner = owners.get(inode)
            if owner is not None:
                found.add(ListenSocket(pid=owner, host=ip, port=port))
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
        members = tuple(pids)
        listening = listening_sockets(members)
        owned: bool | None = any(s.port == self._port for s in listening)
        if not owned and members and not any(_fds_readable(pid) for pid in members):
            owned = None
        return PortsObservation(
            listening=listening,
            server_port_accepts=port_accepts(self._host, self._port, self._timeout_s),
            server_port_owned=owned,
        )


def _fds_readable(pid: int, proc_root: str = "/proc") -> bool:
    try:
        os.listdir(f"{proc_root}/{pid}/fd")
    except OSError:
        return False
    return True


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
