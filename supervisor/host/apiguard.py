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
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass
from typing import Any

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


@dataclass
class GuardStats:
    refused: int = 0  # connections closed at accept: over the cap
    header_timeouts: int = 0  # connections closed: request (headers and body) not complete in time


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


def guarded_protocol(max_connections: int, header_timeout_s: float, stats: GuardStats) -> type[H11Protocol]:
    """An h11 protocol class for uvicorn's `Config(http=...)` with the cap and the request deadline.

    The deadline covers the whole request, headers and body: a client that completes its headers and
    then trickles its body (a byte every few seconds) is closed like one that trickles headers. Over
    the cap, the connection that has waited longest without a complete request (a trickler, an idle
    keep-alive) is closed to make room, so a fresh `/livez` or `/status` still gets through a flood;
    only when every connection is mid-answer is the newcomer refused.
    """
    receiving: dict[H11Protocol, None] = {}  # accept order: connections without a complete request

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                victim = next(iter(receiving), None)
                stats.refused += 1
                if victim is None:
                    transport.abort()
                    return
                receiving.pop(victim, None)
                victim.transport.abort()
            self._arm_header_deadline()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._request_received():
                self._cancel_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self._request_received():
                self._arm_header_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_deadline()
            super().connection_lost(exc)

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

        def _header_deadline_passed(self) -> None:
            self._header_timer = None
            receiving.pop(self, None)
            if not self._request_received() and not self.transport.is_closing():
                stats.header_timeouts += 1
                self.transport.abort()

    return GuardedH11Protocol


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
