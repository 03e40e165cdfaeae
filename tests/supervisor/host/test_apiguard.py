"""The API's connection cap follows the descriptor limit."""

from __future__ import annotations

import asyncio
import resource
import socket
from typing import Any

import pytest

from supervisor.host.apiguard import (
    MAX_CONNECTIONS,
    MIN_CONNECTIONS,
    GuardStats,
    connection_cap,
    guarded_protocol,
    uvicorn_options,
)


@pytest.mark.parametrize(
    "soft,cap",
    [(1024, 256), (256, 64), (40, MIN_CONNECTIONS), (1 << 20, MAX_CONNECTIONS), (resource.RLIM_INFINITY, 256)],
)
def test_cap_is_a_quarter_of_the_soft_limit_within_bounds(soft: int, cap: int) -> None:
    assert connection_cap(soft) == cap


def test_options_bound_accept_bursts_and_keep_alive() -> None:
    opts = uvicorn_options(GuardStats(), soft_nofile=1024)
    assert opts["limit_concurrency"] is None and opts["backlog"] <= 128 and opts["timeout_keep_alive"] <= 10


async def _livez_app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _serve_guarded(stats: GuardStats, **kw: Any) -> tuple[Any, asyncio.Task[None], int]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # No log_config or log_level: uvicorn would set its loggers' levels for the whole test process.
    http = guarded_protocol(2, 10.0, stats, probe_slots=2, **kw)
    config = uvicorn.Config(_livez_app, http=http, log_config=None, access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, port


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> bytes:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    await writer.drain()
    return await asyncio.wait_for(reader.read(4096), 5)


async def test_a_probe_the_loop_has_not_read_yet_is_not_closed_for_a_newcomer() -> None:
    """At the cap, accepted in one burst: a probe whose request is still in the kernel, then idle
    attackers. The oldest incomplete connection used to be closed to make room: the probe, reset on a
    loaded machine. A peek tells it apart; an attacker is closed instead."""
    stats = GuardStats()
    server, task, port = await _serve_guarded(stats)
    socks: list[socket.socket] = []
    try:
        # No await from here to the reads: the loop accepts all four in one pass, reads nothing yet.
        probe = socket.create_connection(("127.0.0.1", port), timeout=5)
        probe.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        socks.append(probe)
        socks.extend(socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3))
        probe.setblocking(False)
        answer = b""
        for _ in range(500):
            await asyncio.sleep(0.01)
            try:
                answer += probe.recv(4096)
            except BlockingIOError:
                continue
            if b"ok" in answer or not answer:
                break
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert stats.refused >= 1
    finally:
        for sk in socks:
            sk.close()
        server.should_exit = True
        await task


def test_a_peek_tells_a_waiting_probe_from_another_request_and_reads_nothing() -> None:
    from types import SimpleNamespace

    from supervisor.host.apiguard import _probe_waiting

    for sent, probe in [
        (b"GET /livez HTTP/1.1\r\n", True),
        (b"GET /readyz?x=1 HTTP/1.1\r\n", True),
        (b"GET /livezz HTTP/1.1\r\n", False),
        (b"GET /metrics HTTP/1.1\r\n", False),
        (b"", False),
    ]:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            theirs.sendall(sent)
            conn = SimpleNamespace(transport=SimpleNamespace(get_extra_info=lambda _name, s=ours: s))
            assert _probe_waiting(conn) is probe, sent  # type: ignore[arg-type]
            ours.setblocking(False)
            if sent:
                assert ours.recv(64) == sent  # still there for the loop to read
