"""The API server's housekeeping loop (issue 51): one tick a second, not uvicorn's ten, and a stop
that does not wait for the tick."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import uvicorn

from supervisor.root import serve
from supervisor.root.serve import _ApiServer, bind_socket


async def _app(scope: dict[str, object], receive: object, send: object) -> None:
    return None


def _server() -> tuple[_ApiServer, socket.socket]:
    sock = bind_socket("127.0.0.1", 0)
    config = uvicorn.Config(_app, lifespan="off", log_config=None, access_log=False)
    return _ApiServer(config), sock


async def _running(server: _ApiServer, sock: socket.socket) -> asyncio.Task[None]:
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started:
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the API server did not start")


async def test_a_stop_wakes_the_tick_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve, "API_TICK_S", 30.0)  # without the wake-up, the stop would wait this out
    server, sock = _server()
    task = await _running(server, sock)
    await asyncio.sleep(0.1)
    t0 = time.monotonic()
    server.should_exit = True
    await asyncio.wait_for(task, timeout=10)
    assert time.monotonic() - t0 < 5  # uvicorn's own shutdown, not the 30 s tick
    sock.close()


async def test_the_loop_ticks_at_the_api_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve, "API_TICK_S", 0.3)
    server, sock = _server()
    ticks: list[int] = []
    on_tick = server.on_tick

    async def counted(counter: int) -> bool:
        ticks.append(counter)
        return await on_tick(counter)

    monkeypatch.setattr(server, "on_tick", counted)
    task = await _running(server, sock)
    await asyncio.sleep(0.9)
    server.should_exit = True
    await asyncio.wait_for(task, timeout=10)
    sock.close()
    # About 4 in 0.9 s (uvicorn's own loop: 10); each a multiple of 10, so the date header is
    # refreshed at every tick, as uvicorn does once a second.
    assert 1 <= len(ticks) <= 6, ticks
    assert all(c % 10 == 0 for c in ticks)
