"""The API's defence of the daemon's file descriptors: a cap on open connections, a deadline for
the whole request (headers and body).

uvicorn's `limit_concurrency` answers 503 only once a request's headers are complete, and a
connection that never completes them has no timeout at all (the keep-alive timer starts after a
response). A client trickling one header line every few seconds on thousands of connections
therefore held a descriptor per connection until the daemon hit EMFILE and could no longer read
/proc or reach the server. Here every connection over the cap is closed at once, and every
connection that has not finished a request, headers and body, within `header_timeout_s` (counted
from the accept, or from the end of its previous response) is closed. (Only the headers were bounded
before: 128 connections trickling a body held every slot and /livez answered 1 time in 38.)

Clients that send and never read were the next attack (issue 33): 260 connections pipelining
`GET /metrics` without reading held every slot mid-answer (no write had a deadline, so none was
ever a victim) and /livez failed for 45 s; 40 pipelining `/livez` grew the daemon to 1 GB (uvicorn
resumes reading after each pipelined request, so input and answers piled up without bound). Now
nothing more is read while an answer is pending, unprocessed input is capped, an answer left
unread for WRITE_TIMEOUT_S closes its connection, a stalled reader is a victim at the cap, and the
probes keep PROBE_SLOTS reserved connections beyond the cap (docs/DECISIONS.md, issue 33).

That bound leaked (issue 50): 260 connections pipelining `GET /livez` with a 1 KiB receive buffer
grew the daemon to 4.7 GB. A route that awaits its request's body (`BodyLimit` does, for every
route) makes uvicorn resume reading on the transport, so each pipelined request let one more read
(up to 256 KiB) into h11's buffer whatever the cap said; and a pipeliner between answers was neither
stalled nor waiting, so it was never a victim and 256 of them held every slot. Now the guard's flow
control refuses to resume reading while the input held is over the cap, whoever asks (the bound is
on bytes held per connection, not on the route), and a connection that sends a request before its
previous answer is done is a pipeliner: pipeliners are victims before fresh connections at the cap,
and together hold at most PIPELINER_SHARE of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

# The daemon needs descriptors of its own (the server's pipes, /proc, NVML, the probes' sockets,
# threads' files): the API may use at most a quarter of the soft limit, and never more than this.
MAX_CONNECTIONS = 256
MIN_CONNECTIONS = 16
# Requests to this API are a few hundred bytes; a client that cannot send its headers in 10 s is not
# a client (slowloris). Long answers (a bundle download) are not limited by this: only the request.
HEADER_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5
ACCEPT_BURST = 64


# A client must take its answer: one that leaves an answer unread (the kernel's send buffer full and
# some of it still in the daemon) for this long is closed; its answer is not worth the daemon's memory.
WRITE_TIMEOUT_S = 10.0
SEND_BUFFER = 64 * 1024  # the kernel's send buffer per API connection (it doubles it)
MAX_BUFFERED_INPUT = 64 * 1024  # unprocessed input (pipelined requests) held per connection
# Connections beyond the cap for the probes when every other one is busy answering.
PROBE_SLOTS = 8
PROBE_PATHS = frozenset({"/livez", "/readyz"})
# Pipeliners (a request sent before the previous answer was done: no browser, CLI or scraper does
# that) hold at most this share of the cap; the oldest goes for a new one beyond it.
PIPELINER_SHARE = 0.5
# What one read from a connection may add to its input (asyncio reads 256 KiB at once by default).
READ_CHUNK = 16 * 1024


@dataclass
class GuardStats:
    refused: int = 0  # connections over the cap (another was closed for it, or it was)
    header_timeouts: int = 0  # connections closed: request (headers and body) not complete in time
    write_timeouts: int = 0  # connections closed: the client did not read its answer in time
    reads_paused: int = 0  # times reading was held: an answer pending or too much input waiting
    probe_slot: int = 0  # connections served on a reserved probe slot
    pipeliners_closed: int = 0  # pipelining connections closed for others (the cap or their share)


def connection_cap(soft_nofile: int | None = None) -> int:
    """A quarter of the soft RLIMIT_NOFILE, within [MIN_CONNECTIONS, MAX_CONNECTIONS]."""
    if soft_nofile is None:
        soft_nofile, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft_nofile == resource.RLIM_INFINITY or soft_nofile <= 0:
        return MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, soft_nofile // 4))


def raise_nofile_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit (systemd's default soft limit is 1024); returns both."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    target = min(target, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft, hard


def guarded_protocol(
    max_connections: int,
    header_timeout_s: float,
    stats: GuardStats,
    *,
    write_timeout_s: float | None = None,
    max_buffered_input: int | None = None,
    probe_slots: int | None = None,
) -> type[H11Protocol]:
    """An h11 protocol class for uvicorn's `Config(http=...)`: the cap, the request deadline, the
    write deadline, the bound on pipelined input and the probes' reserved slots.

    The request deadline covers the whole request, headers and body: a client that completes its
    headers and then trickles its body (a byte every few seconds) is closed like one that trickles
    headers. Over the cap, the connection that has longest not read its answer is closed to make
    room, else the one that has waited longest without a complete request (a trickler, an idle
    keep-alive); only when every connection is busy answering a client that reads does the newcomer take
    one of `probe_slots` reserved connections, which answer `/livez` and `/readyz` only.

    While an answer is pending nothing more is read from the connection (pipelined requests wait in
    the kernel's socket buffer, not in the daemon), and never more than `max_buffered_input` bytes
    of unprocessed input are held. An answer that the client does not read (the transport's buffer
    stays over its high-water mark) for `write_timeout_s` closes the connection.
    """
    write_timeout = WRITE_TIMEOUT_S if write_timeout_s is None else write_timeout_s
    input_cap = MAX_BUFFERED_INPUT if max_buffered_input is None else max_buffered_input
    reserved = PROBE_SLOTS if probe_slots is None else probe_slots
    receiving: dict[H11Protocol, None] = {}  # accept order: connections without a complete request
    stalled: dict[H11Protocol, None] = {}  # since when: answers the client does not read
    probe_only: set[H11Protocol] = set()  # the reserved slots in use
    pipelining: dict[H11Protocol, None] = {}  # since when: connections that sent ahead of an answer
    pipeliner_budget = max(1, int(max_connections * PIPELINER_SHARE))

    def evict_one(pool: Callable[[H11Protocol], bool]) -> bool:
        """Close the longest-stalled connection of `pool` (a client not reading its answer), else the
        oldest pipeliner (whatever its route), else the longest-waiting incomplete one. Stalled and
        pipelining first: a fresh connection is incomplete for the moment its request takes to
        arrive, and attackers reconnecting must not close a probe's."""
        for group in (stalled, pipelining, receiving):
            victim = next((c for c in group if pool(c) and not (group is receiving and _probe_waiting(c))), None)
            if victim is not None:
                if group is pipelining:
                    stats.pipeliners_closed += 1
                receiving.pop(victim, None)
                stalled.pop(victim, None)
                pipelining.pop(victim, None)
                victim.transport.abort()
                return True
        return False

    class GuardedFlow(FlowControl):
        """uvicorn's flow control, except that reading never resumes while the connection holds
        more unprocessed input than the cap (uvicorn resumes it whenever a route awaits a message)."""

        def __init__(self, transport: asyncio.Transport, held: Callable[[], int]) -> None:
            super().__init__(transport)
            self._held = held

        def resume_reading(self) -> None:
            if self._held() <= input_cap:
                super().resume_reading()

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _write_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # The next pipelined request waits until this answer is in the kernel (high water 0), and
            # the kernel holds little of it (SO_SNDBUF): a client that does not read stalls within a
            # few answers instead of having the daemon generate megabytes of them for it.
            transport.set_write_buffer_limits(high=0)
            self.flow = GuardedFlow(transport, self._buffered_input)
            if hasattr(transport, "max_size"):  # asyncio's selector transport reads this much at once
                transport.max_size = READ_CHUNK  # type: ignore[attr-defined]
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            if len(self.connections) - len(probe_only) > max_connections:
                stats.refused += 1
                if not evict_one(lambda c: c not in probe_only):
                    if len(probe_only) >= reserved and not evict_one(lambda c: c in probe_only):
                        transport.abort()
                        return
                    stats.probe_slot += 1
                    probe_only.add(self)
                    self.app = probes_only(self.app)
            self._arm_header_deadline()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._request_received():
                self._cancel_header_deadline()
                if self._buffered_input() > 0 and self not in pipelining and not self.transport.is_closing():
                    self._became_pipeliner()
            self._bound_input()

        def _became_pipeliner(self) -> None:
            pipelining[self] = None
            while len(pipelining) > pipeliner_budget and evict_one(lambda c: c in pipelining and c is not self):
                pass

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self._request_received():
                self._arm_header_deadline()
            self._bound_input()

        def pause_writing(self) -> None:
            super().pause_writing()
            stalled[self] = None
            if self._write_timer is None:
                self._write_timer = self.loop.call_later(write_timeout, self._write_deadline_passed)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._cancel_write_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_deadline()
            self._cancel_write_deadline()
            probe_only.discard(self)
            pipelining.pop(self, None)
            super().connection_lost(exc)

        def _buffered_input(self) -> int:
            buf = getattr(self.conn, "_receive_buffer", None)  # h11's unprocessed bytes
            return len(buf) if buf is not None else 0

        def _bound_input(self) -> None:
            """Stop reading while an answer is pending or too much input waits (uvicorn resumes
            reading directly on the transport after a pipelined request, so its own pause leaks)."""
            cycle = self.cycle
            answering = cycle is not None and not cycle.response_complete and not cycle.more_body
            if (answering or self._buffered_input() > input_cap) and not self.transport.is_closing():
                if not self.flow.read_paused:
                    stats.reads_paused += 1
                self.flow.read_paused = True
                self.transport.pause_reading()

        def _request_received(self) -> bool:
            """Headers and body are in (the route may still be answering)."""
            cycle = self.cycle
            return cycle is not None and not cycle.response_complete and not cycle.more_body

        def _arm_header_deadline(self) -> None:
            self._cancel_header_deadline()
            receiving[self] = None
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_deadline_passed)

        def _cancel_header_deadline(self) -> None:
            receiving.pop(self, None)
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _cancel_write_deadline(self) -> None:
            stalled.pop(self, None)
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _header_deadline_passed(self) -> None:
            self._header_timer = None
            receiving.pop(self, None)
            if not self._request_received() and not self.transport.is_closing():
                stats.header_timeouts += 1
                self.transport.abort()

        def _write_deadline_passed(self) -> None:
            self._write_timer = None
            stalled.pop(self, None)
            if not self.transport.is_closing() and self.transport.get_write_buffer_size() > 0:
                stats.write_timeouts += 1
                self.transport.abort()

    return GuardedH11Protocol


def _probe_waiting(conn: H11Protocol) -> bool:
    """A `/livez` or `/readyz` request is in the kernel, not yet read by the loop: a fresh probe on
    a loaded machine looks like any connection without a request, and was the longest-waiting one
    closed for an attacker reconnecting at the cap. A peek tells it apart without reading it."""
    transport = conn.transport
    wrapped = transport.get_extra_info("socket") if transport is not None else None
    if wrapped is None:
        return False
    try:
        sock = socket.socket(fileno=wrapped.fileno())  # the same descriptor, detached below
    except OSError:
        return False
    try:
        head = sock.recv(len(_PROBE_LINE_LONGEST), socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        head = b""
    finally:
        sock.detach()
    return head.startswith(_PROBE_LINES)


_PROBE_LINES = tuple(f"GET {path} ".encode() for path in sorted(PROBE_PATHS)) + tuple(
    f"GET {path}?".encode() for path in sorted(PROBE_PATHS)
)
_PROBE_LINE_LONGEST = max(_PROBE_LINES, key=len)


def probes_only(app: ASGIApp) -> ASGIApp:
    """The app as a reserved connection serves it: `/livez` and `/readyz`, then close; else 503."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in PROBE_PATHS:
            body = b'{"error":"busy","detail":"the API is at its connection cap; only /livez and /readyz answer"}'
            headers = [(b"content-type", b"application/json"), (b"connection", b"close"), (b"retry-after", b"1")]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await app(scope, receive, closing)

    return guarded


def uvicorn_options(stats: GuardStats, *, soft_nofile: int | None = None) -> dict[str, Any]:
    """The uvicorn.Config keywords that bound what the API's clients can hold."""
    cap = connection_cap(soft_nofile)
    return {
        "http": guarded_protocol(cap, HEADER_TIMEOUT_S, stats),
        # No limit_concurrency: the cap above bounds connections (and so requests) at accept, and
        # uvicorn's own limit answered a plain-text 503 to /livez while tricklers held the slots.
        "limit_concurrency": None,
        "timeout_keep_alive": KEEP_ALIVE_S,
        # asyncio accepts up to `backlog` connections per wake-up before any of them is refused, and
        # uvicorn re-listens the socket with it: 2048 (uvicorn's default) let a burst of reconnects
        # hold a thousand descriptors for a moment.
        "backlog": ACCEPT_BURST,
    }
