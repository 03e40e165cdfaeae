"""Loopback ports for tests that start servers.

A port the kernel just handed out for bind(0) is free now, but the kernel may hand the same one out
again at the next call. A test that asks for two ports (the server's and the daemon API's) then got
one port twice, and the daemon refused to launch onto its own API's port. So no port is given out
twice in one test process.

The suite runs in parallel workers (pytest-xdist), and a port is often chosen seconds before its
server binds it (the simulator binds after its "weights" load; a restart leaves it unbound between
launches). Another worker's bind(0) could be handed that port in the gap. So ports come from below
the kernel's ephemeral range (where neither bind(0) nor an outgoing connection ever lands), and each
worker draws from its own slice of it; the bind below checks that nothing else on the machine (another
checkout's suite) holds the one drawn.
"""

from __future__ import annotations

import os
import random
import socket

_issued: set[int] = set()
_rng = random.Random()  # its own, seeded from the OS: a test that seeds `random` does not steer it
LOWEST = 10000  # above the well-known and registered ports services tend to sit on
_EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"


def _ephemeral_low(path: str = _EPHEMERAL) -> int:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def worker_slice(worker: str, count: int, ephemeral_low: int) -> range | None:
    """This worker's ports: `gwN` of `count` workers gets the Nth of `count` equal slices of
    [LOWEST, ephemeral_low); None where that space is too small to share (then bind(0) it is)."""
    count = max(count, 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (ephemeral_low - LOWEST) // count
    if size < 200 or index >= count:
        return None
    start = LOWEST + index * size
    return range(start, start + size)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    ports = worker_slice(
        os.environ.get("PYTEST_XDIST_WORKER", ""),
        int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1),
        _ephemeral_low(),
    )
    if ports is not None:
        for _ in range(1000):
            port = _rng.choice(ports)
            if port not in _issued and _bindable(port):
                _issued.add(port)
                return port
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            found: int = s.getsockname()[1]
        if found not in _issued:
            _issued.add(found)
            return found
