"""The loop survives everything, through the running daemon: an exception in a poll or in the middle
of a restart, /proc that cannot be read, API clients that hold connections open."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import ready
from statedir import events

from supervisor.host import apiguard

pytestmark = pytest.mark.integration


async def metric(api: str, name: str) -> float:
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"{api}/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def test_an_exception_in_a_poll_is_counted_and_survived(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok"))
    await r.wait_for(ready, 30, "ready")
    real = r.owner.observer.observe
    calls = 0

    async def broken(target: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise RuntimeError("probe blew up")
        return await real(target)

    r.owner.observer.observe = broken  # type: ignore[method-assign]
    await r.wait_for(lambda x: x.loop_errors >= 3, 20, "three survived loop errors")
    await asyncio.sleep(3 * r.settings.watchdog.poll_interval_s)
    snap = r.snap()
    assert snap.state == "ready" and snap.incidents == 0 and not r.task.done()
    assert await metric(r.api, "sglang_supervisor_loop_errors_total") >= 3
    async with httpx.AsyncClient() as c:
        assert (await c.get(f"{r.api}/status")).json()["loop_errors"] >= 3
    assert any(e["event"] == "loop_error" and "probe blew up" in e["error"] for e in events(r.settings.state_dir))


async def test_an_exception_in_the_middle_of_a_restart_is_finished_by_the_loop(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok"))
    await r.wait_for(ready, 30, "ready")
    first_pid = r.snap().pid
    real_stop = r.owner.control.stop
    calls = 0

    def stop_once_broken(*a: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError(24, "Too many open files")
        return real_stop(*a)

    r.owner.control.stop = stop_once_broken  # type: ignore[method-assign]
    async with httpx.AsyncClient() as c:
        assert (await c.post(f"{r.api}/restart", json={})).status_code == 202
    await r.wait_for(lambda x: x.loop_errors >= 1, 20, "the stop's error survived")
    snap = await r.wait_for(lambda x: x.state == "ready" and x.pid != first_pid, 60, "ready on a new server")
    assert calls >= 2 and snap.incidents >= 1
    stopped = [e for e in events(r.settings.state_dir) if e["event"] == "server_stopped"]
    assert stopped and stopped[-1]["survivors"] == [] and stopped[-1]["port_free"] is True


async def test_unreadable_proc_is_unknown_not_exited(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok"))
    await r.wait_for(ready, 30, "ready")
    probe = r.owner.observer.tree_probe
    real_proc = probe._proc
    (tmp_path / "no-proc").mkdir()
    probe._proc = str(tmp_path / "no-proc")  # every /proc read fails, as under EMFILE or EACCES
    try:
        for _ in range(int(4 / r.settings.watchdog.poll_interval_s)):
            await asyncio.sleep(r.settings.watchdog.poll_interval_s)
            assert r.snap().state in ("ready", "degraded"), r.snap().reason
    finally:
        probe._proc = real_proc
    assert r.owner.counters.unknown_observations >= 3
    await asyncio.sleep(2 * r.settings.watchdog.poll_interval_s)
    snap = r.snap()
    # Serving still (a health check that timed out on a loaded machine makes it `degraded` for a
    # moment, which is not what this test is about), and nothing counted as an exit or a restart.
    assert snap.state in ("ready", "degraded") and snap.incidents == 0 and snap.restarts == 0, snap.reason


def _open_idle(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /status HTTP/1.1\r\n")  # a request line, and headers that never end
        socks.append(s)
    return socks


def _closed_by_peer(s: socket.socket, timeout: float) -> bool:
    s.settimeout(timeout)
    try:
        return s.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def test_slow_header_connections_are_capped_and_timed_out(daemon, sim, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(apiguard, "MAX_CONNECTIONS", 20)
    monkeypatch.setattr(apiguard, "MIN_CONNECTIONS", 20)
    monkeypatch.setattr(apiguard, "HEADER_TIMEOUT_S", 2.0)
    r = await daemon(sim("ok"))
    await r.wait_for(ready, 30, "ready")
    port = r.settings.api.port
    socks = await asyncio.to_thread(_open_idle, port, 30)
    try:
        await asyncio.sleep(0.5)
        # Over the cap, the oldest connections without a complete request make room for the newest.
        over = await asyncio.to_thread(lambda: sum(_closed_by_peer(s, 0.2) for s in socks[:10]))
        assert over == 10, "the oldest incomplete connections over the cap are closed at once"
        late = await asyncio.to_thread(lambda: sum(_closed_by_peer(s, 5.0) for s in socks[10:]))
        assert late == 20, "headers not complete within the deadline: closed"
    finally:
        for s in socks:
            s.close()
    async with httpx.AsyncClient(timeout=2) as c:
        assert (await c.get(f"{r.api}/status")).json()["state"] == "ready"
    assert r.snap().incidents == 0


async def test_an_exception_during_start_up_is_survived_and_the_server_started(daemon, sim, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from supervisor.daemon import stopping

    async def broken(*args: Any) -> Any:  # the start-up's sweep of a predecessor's leftovers
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(stopping, "sweep", broken)
    r = await daemon(sim("ok", tp=1))
    snap = await r.wait_for(lambda x: x.state == "ready", 60, "ready despite the failed start-up")
    assert snap.loop_errors == 1 and not r.task.done()
    assert any("start-up failed" in str(e.get("reason", "")) for e in events(r.settings.state_dir))


def _open_trickling(port: int, n: int) -> list[socket.socket]:
    """Complete headers, then a body that comes a byte at a time (the attack that held every slot)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(
            b"POST /restart HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # an allowed name: the body is what hangs
            b"Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n{"
        )
        socks.append(s)
    return socks


def _trickle(socks: list[socket.socket], stop: threading.Event) -> None:
    while not stop.wait(0.3):
        for s in socks:
            try:
                s.send(b" ")
            except OSError:
                continue


@pytest.mark.parametrize("cap", [None, 40])
async def test_bodies_trickled_on_128_connections_leave_livez_and_status_answering(
    daemon, sim, monkeypatch, cap
) -> None:  # type: ignore[no-untyped-def]
    if cap is not None:  # a flood over the cap too: the newest requests still get through
        monkeypatch.setattr(apiguard, "MAX_CONNECTIONS", cap)
        monkeypatch.setattr(apiguard, "MIN_CONNECTIONS", cap)
    monkeypatch.setattr(apiguard, "HEADER_TIMEOUT_S", 3.0)
    r = await daemon(sim("ok"))
    await r.wait_for(ready, 30, "ready")
    socks = await asyncio.to_thread(_open_trickling, r.settings.api.port, 128)
    stop = threading.Event()
    trickler = threading.Thread(target=_trickle, args=(socks, stop), daemon=True)
    trickler.start()
    try:
        answers = []
        async with httpx.AsyncClient(timeout=2) as c:
            for _ in range(15):
                for path in ("/livez", "/status"):
                    resp = await c.get(f"{r.api}{path}", headers={"Connection": "close"})
                    answers.append((resp.status_code, resp.headers.get("content-type", "")))
                await asyncio.sleep(0.1)
        assert answers == [(200, "application/json")] * 30, answers
        # The whole request is bounded: every trickler is closed by the deadline, none restarted anything.
        closed = await asyncio.to_thread(lambda: sum(_closed_by_peer(s, 6.0) for s in socks))
        assert closed == 128
    finally:
        stop.set()
        trickler.join(5)
        for s in socks:
            s.close()
    assert r.snap().restarts == 0 and r.snap().state == "ready"
