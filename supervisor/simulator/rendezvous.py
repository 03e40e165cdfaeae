"""The group's rendezvous at `--dist-init-addr`, as torch's `tcp://` init does it.

Global rank 0 (node 0's `sglang::scheduler_TP0`) listens there, like torch's TCPStore server; every
other rank of every node connects and says who it is. Nobody passes `Init torch distributed` until
the whole world has joined, and the connections stay up afterwards as the group's collective links.
A rank that cannot reach the store retries until the process group's timeout, as TCPStore's client
does; a latecomer to a group that already formed is held and never answered (its old peers will
not rendezvous again), so a node relaunched alone waits there too. Waiting prints nothing.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from supervisor.simulator.links import Go, Hello, Link
from supervisor.simulator.mirror.torch.distributed.rendezvous import _create_c10d_store
from supervisor.simulator.nodes import NodeLayout, split_addr

HELLO_WAIT_S = 10.0  # a connection that says nothing is not a rank
CONNECT_RETRY_S = 1.0  # TCPStore's client retries a refused connect about once a second


class RendezvousError(RuntimeError):
    """The rendezvous failed; the message is the one torch raises."""


class StoreServer:
    """The listener on rank 0; joined ranks' links are handed over once everyone is there."""

    def __init__(self, host: str, port: int, world_size: int) -> None:
        self.world_size = world_size
        self.port = port
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a relaunch reuses the port
        try:
            self._sock.bind((host, port))
            self._sock.listen(256)
        except OSError as e:
            self._sock.close()
            raise RendezvousError(
                "The server socket has failed to listen on any local network address. "
                f"port: {port}, useIpv6: {family == socket.AF_INET6}, code: -{e.errno}, "
                f"name: {_errno_name(e.errno)}, message: {(e.strerror or str(e)).lower()}"
            ) from None
        self._cond = threading.Condition()
        self._joined: dict[int, Link] = {}
        self._formed = False
        self._held: list[Link] = []  # latecomers: connected, never answered
        threading.Thread(target=self._accept_loop, name="TCPStore-server", daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._greet, args=(conn,), name="TCPStore-conn", daemon=True).start()

    def _greet(self, conn: socket.socket) -> None:
        link = Link(conn)
        try:
            hello = link.recv() if link.poll(HELLO_WAIT_S) else None
        except (EOFError, OSError):
            hello = None
        with self._cond:
            valid = isinstance(hello, Hello) and 0 < hello.rank < self.world_size
            if not valid or self._formed:
                self._held.append(link)  # not a member of this group (or too late): never answered
                return
            assert isinstance(hello, Hello)
            old = self._joined.get(hello.rank)
            if old is not None:
                old.close()  # the same rank relaunched before the group formed: the newest wins
            self._joined[hello.rank] = link
            self._cond.notify_all()

    def wait_for_world(self, deadline: float) -> list[Link]:
        """Every other rank's link, in rank order, once all joined; RendezvousError at the deadline."""
        started = time.monotonic()
        with self._cond:
            while len(self._joined) < self.world_size - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RendezvousError(
                        f"Timed out after {int(time.monotonic() - started) + 1} seconds waiting for clients. "
                        f"{len(self._joined) + 1}/{self.world_size} clients joined."
                    )
                self._cond.wait(min(left, 1.0))
            self._formed = True
            links = [self._joined[rank] for rank in sorted(self._joined)]
        for link in links:
            with contextlib.suppress(OSError):
                link.send(Go())
        return links


def _errno_name(errno: int | None) -> str:
    import errno as errno_names

    return errno_names.errorcode.get(errno or 0, "UNKNOWN")


def _client(host: str, port: int, rank: int, world_size: int, deadline: float, timeout_s: float) -> Link:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RendezvousError(
                f"The client socket has timed out after {int(timeout_s * 1000)}ms while trying to connect "
                f"to ({host}, {port})."
            )
        try:
            sock = socket.create_connection((host, port), timeout=min(left, CONNECT_RETRY_S))
        except OSError:
            time.sleep(min(CONNECT_RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        link = Link(sock)
        try:
            link.send(Hello(rank, world_size))
            while time.monotonic() < deadline:
                if link.poll(min(1.0, max(0.0, deadline - time.monotonic()))) and isinstance(link.recv(), Go):
                    return link
        except (EOFError, OSError):
            link.close()  # the store went away before the group formed: try again until the timeout
            continue
        link.close()
        raise RendezvousError(f"wait timeout after {int(timeout_s * 1000)}ms, keys: /default_pg/0//cuda//0")


def host_store(host: str, port: int, world_size: int, timeout_s: float) -> list[Link]:
    """Rank 0: listen at the rendezvous address and wait for the rest of the world."""
    deadline = time.monotonic() + timeout_s
    return _create_c10d_store(lambda: StoreServer(host, port, world_size).wait_for_world(deadline))


def join_store(host: str, port: int, rank: int, world_size: int, timeout_s: float) -> Link:
    """Any other rank: reach rank 0's store and wait until the group forms."""
    deadline = time.monotonic() + timeout_s
    return _create_c10d_store(lambda: _client(host, port, rank, world_size, deadline, timeout_s))


def unreachable(timeout_s: float) -> Link:
    """No `--dist-init-addr` on a node >= 1: the default address is its own host and a random port,
    where no store will ever be. It waits out the timeout like a client that never connects."""
    time.sleep(timeout_s)
    raise RendezvousError(f"The client socket has timed out after {int(timeout_s * 1000)}ms while trying to connect.")


def meet(layout: NodeLayout, rank: int, host: str) -> list[Link]:
    """This rank's part of `init_process_group`: rank 0 gets a link to every other rank, any other
    rank one link to rank 0. Raises RendezvousError as torch raises when the group never forms."""
    world = layout.tp_size
    if not 0 <= rank < world:
        raise RendezvousError(f"Invalid rank {rank}, rank should be in the interval [0, {world - 1}]")
    addr = split_addr(layout.dist_init_addr) if layout.dist_init_addr else None
    if layout.dist_init_addr and addr is None:
        raise RendezvousError(f"Invalid address {layout.dist_init_addr!r}: expected HOST:PORT")
    if rank == 0:
        store_host, port = addr if addr is not None else (host, 0)  # no address: a random port nobody knows
        return host_store(store_host, port, world, layout.timeout_s)
    if addr is None:
        return [unreachable(layout.timeout_s)]
    return [join_store(addr[0], addr[1], rank, world, layout.timeout_s)]
