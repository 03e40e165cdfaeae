"""One TCP connection between two ranks of a multi-node group: newline-delimited JSON messages.

What travels between nodes is plain data (never pickles: the rendezvous port may face a network).
`Link` offers what a multiprocessing `Connection` offers the serving loop (`send`, `recv`, `poll`),
so rank 0 drives local and remote peers alike.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
from dataclasses import dataclass
from typing import Protocol

from supervisor.simulator.messages import Ack, FiredUp, Step

MAX_LINE = 64 * 1024  # a longer line is not one of ours: the peer is treated as gone


@dataclass(frozen=True)
class Hello:
    """A rank joins the rendezvous: its global rank and the group size it was launched for."""

    rank: int
    world_size: int


@dataclass(frozen=True)
class Go:
    """Every rank has joined: `Init torch distributed` may end."""


@dataclass(frozen=True)
class Done:
    """The collective's result: every rank contributed, each may leave it."""


Message = Hello | Go | Step | Ack | FiredUp | Done
STEP_KINDS = ("prefill", "decode", "profile", "capture")  # the last two: vLLM's start-up broadcasts


class Peer(Protocol):
    """What a rank needs of the channel to another rank: a `Link` across nodes, a multiprocessing
    `Connection` between processes of one node."""

    def send(self, message: Message) -> None: ...

    def recv(self) -> Message: ...

    def poll(self, timeout: float | None = ...) -> bool: ...


def encode(message: Message) -> bytes:
    if isinstance(message, Hello):
        body: dict[str, object] = {"t": "hello", "rank": message.rank, "world_size": message.world_size}
    elif isinstance(message, Step):
        body = {"t": "step", "kind": message.kind}
    elif isinstance(message, Ack):
        body = {"t": "ack", "rank": message.rank}
    else:
        body = {"t": {Go: "go", FiredUp: "fired_up", Done: "done"}[type(message)]}
    return json.dumps(body).encode() + b"\n"


def decode(line: bytes) -> Message | None:
    """A message, or None for anything that is not one (ignored, as a store ignores junk keys)."""
    try:
        body = json.loads(line)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    kind = body.get("t")
    number = body.get("rank")
    if kind == "hello" and isinstance(number, int) and isinstance(body.get("world_size"), int):
        return Hello(number, int(body["world_size"]))
    if kind == "ack" and isinstance(number, int):
        return Ack(number)
    if kind == "step" and body.get("kind") in STEP_KINDS:
        return Step(str(body["kind"]))
    simple: dict[str, Message] = {"go": Go(), "fired_up": FiredUp(), "done": Done()}
    return simple.get(str(kind))


class Link:
    def __init__(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # a step is a few bytes: send it now (TCP only)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(True)
        self.sock = sock
        self._buf = b""
        self._eof = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def peer(self) -> tuple[str, int]:
        try:
            host, port = self.sock.getpeername()[:2]
        except (OSError, ValueError):
            return ("unknown", 0)
        return str(host), int(port)

    def send(self, message: Message) -> None:
        """Raises OSError when the peer is gone."""
        self.sock.sendall(encode(message))

    def _fill(self, timeout: float | None) -> None:
        if self._eof:
            return
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return
        try:
            chunk = self.sock.recv(65536)
        except OSError:
            chunk = b""
        self._buf += chunk
        if not chunk or (len(self._buf) >= MAX_LINE and b"\n" not in self._buf):
            self._eof = True  # gone, or not speaking our protocol

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether recv() would return (or raise EOFError) without waiting longer than timeout."""
        if b"\n" not in self._buf:
            self._fill(timeout)
        return b"\n" in self._buf or self._eof

    def recv(self) -> Message:
        """The next message; EOFError once the peer is gone. Lines that are not messages are skipped."""
        while True:
            while b"\n" not in self._buf:
                if self._eof:
                    raise EOFError
                self._fill(None)
            line, self._buf = self._buf.split(b"\n", 1)
            message = decode(line)
            if message is not None:
                return message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
