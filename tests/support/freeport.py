"""Loopback ports for tests that start servers.

A port the kernel just handed out for bind(0) is free now, but the kernel may hand the same one out
again at the next call. A test that asks for two ports (the server's and the daemon API's) then got
one port twice, and the daemon refused to launch onto its own API's port. So no port is given out
twice in one test process.
"""

from __future__ import annotations

import socket

_issued: set[int] = set()


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _issued:
            _issued.add(port)
            return port
