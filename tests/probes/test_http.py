from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Iterator

import httpx
import pytest
from freeport import free_port
from httpserver import QuietHandler, serving

from probes.http import HealthProbe, JsonReply, describe_error, fetch, join_url, make_client


class Ticks:
    """A monotonic clock that moves 0.25 s each time it is read."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


def mock_client(handler: httpx.MockTransport) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=handler)


def raising(exc: Exception) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        raise exc

    return httpx.MockTransport(handle)


def answering(status: int, body: bytes = b"") -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, content=body))


@pytest.mark.parametrize(
    ("transport", "ok", "status", "error"),
    [
        (answering(200), True, 200, ""),
        (answering(503), False, 503, "HTTP 503"),
        (answering(204), False, 204, "HTTP 204"),
        (answering(200, b"x" * (64 * 1024 + 1)), False, 200, "body over 65536 bytes"),
        (raising(httpx.ConnectError("[Errno 111] Connection refused")), False, None, "connection refused"),
        (raising(httpx.ConnectError("[Errno -2] Name or service not known")), False, None, "connect failed: "),
        (raising(httpx.ReadTimeout("timed out")), False, None, "timeout"),
        (raising(httpx.ConnectTimeout("timed out")), False, None, "timeout"),
        (raising(httpx.ReadError("[Errno 104] Connection reset by peer")), False, None, "connection reset"),
        (
            raising(httpx.RemoteProtocolError("Server disconnected without sending a response.")),
            False,
            None,
            "connection closed without a response",
        ),
        (raising(httpx.RemoteProtocolError("illegal status line")), False, None, "invalid HTTP response"),
        (raising(RuntimeError("surprise")), False, None, "RuntimeError: surprise"),
    ],
)
async def test_health_outcomes(transport: httpx.MockTransport, ok: bool, status: int | None, error: str) -> None:
    async with mock_client(transport) as client:
        probe = HealthProbe("http://127.0.0.1:30000", "/health", 1.0, client=client, monotonic=Ticks())
        obs = await probe.probe()
    assert obs.ok is ok
    assert obs.status_code == status
    assert obs.error.startswith(error) if error else obs.error == ""
    assert obs.latency_s == pytest.approx(0.25)
    assert obs.at == pytest.approx(100.75)


async def test_health_uses_the_configured_path() -> None:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200)

    async with mock_client(httpx.MockTransport(handle)) as client:
        probe = HealthProbe("http://127.0.0.1:30000/", "health_generate", 1.0, client=client)
        assert (await probe.probe()).ok
    assert seen == ["http://127.0.0.1:30000/health_generate"]


async def test_never_two_probes_in_flight() -> None:
    release = asyncio.Event()
    calls = 0

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        await release.wait()
        return httpx.Response(200)

    async with mock_client(httpx.MockTransport(handle)) as client:
        probe = HealthProbe("http://h", "/health", 5.0, client=client)
        assert not probe.in_flight
        first = asyncio.ensure_future(probe.probe())
        await asyncio.sleep(0.01)
        assert probe.in_flight
        second = asyncio.ensure_future(probe.probe())
        await asyncio.sleep(0.01)
        release.set()
        a, b = await asyncio.gather(first, second)
        assert a is b and a.ok
        assert calls == 1
        assert not probe.in_flight
        assert (await probe.probe()).ok
        assert calls == 2


async def test_a_cancelled_caller_does_not_cancel_the_shared_probe() -> None:
    release = asyncio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        await release.wait()
        return httpx.Response(200)

    async with mock_client(httpx.MockTransport(handle)) as client:
        probe = HealthProbe("http://h", "/health", 5.0, client=client)
        impatient = asyncio.ensure_future(probe.probe())
        await asyncio.sleep(0.01)
        impatient.cancel()
        patient = asyncio.ensure_future(probe.probe())
        await asyncio.sleep(0.01)
        release.set()
        assert (await patient).ok
        assert impatient.cancelled()


async def test_overall_deadline_covers_a_slow_handler() -> None:
    async def handle(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200)

    async with mock_client(httpx.MockTransport(handle)) as client:
        probe = HealthProbe("http://h", "/health", 0.05, client=client)
        started = time.monotonic()
        obs = await probe.probe()
    assert (obs.ok, obs.error) == (False, "timeout")
    assert time.monotonic() - started < 1.0


async def test_aclose_cancels_a_probe_in_flight_and_closes_its_own_client() -> None:
    hang = asyncio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        await hang.wait()
        return httpx.Response(200)

    probe = HealthProbe("http://h", "/health", 5.0)  # no client given: the probe owns its client
    await probe._client.aclose()
    probe._client = mock_client(httpx.MockTransport(handle))  # still owned, but offline
    pending = asyncio.ensure_future(probe.probe())
    await asyncio.sleep(0.01)
    await probe.aclose()
    assert probe._client.is_closed
    with pytest.raises(asyncio.CancelledError):
        await pending


async def test_aclose_after_a_cancel_waits_for_the_abandoned_request_before_closing_the_client() -> None:
    """A relaunch cancels the request in flight; a reload then closes the probe. Closing the client
    while that request was still connecting let its connection in after the pool had shut: a socket
    no one closed (the suite's 'unclosed transport' warnings). The close waits for it to end."""
    in_handler = asyncio.Event()
    ended_before_close: list[bool] = []
    handled: list[asyncio.Task[object] | None] = []

    class Transport(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            handled.append(asyncio.current_task())  # type: ignore[arg-type]
            in_handler.set()
            try:
                await asyncio.sleep(5)
            finally:
                await asyncio.sleep(0.05)  # the connection's own clean-up, shielded in httpcore
            return httpx.Response(200)

        async def aclose(self) -> None:
            task = handled[0] if handled else None
            ended_before_close.append(task is None or task.done())

    probe = HealthProbe("http://h", "/health", 10.0)
    await probe._client.aclose()
    probe._client = httpx.AsyncClient(transport=Transport())  # still owned by the probe
    stale = asyncio.ensure_future(probe.probe())
    await in_handler.wait()
    probe.cancel()  # the relaunch
    await probe.aclose()  # the reload, later
    assert ended_before_close == [True]
    with pytest.raises(asyncio.CancelledError):
        await stale


async def test_cancel_abandons_the_request_in_flight() -> None:
    calls = 0
    first_call = asyncio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            first_call.set()
            await asyncio.sleep(5)  # the old server, hung
        return httpx.Response(200)

    async with mock_client(httpx.MockTransport(handle)) as client:
        probe = HealthProbe("http://h", "/health", 10.0, client=client)
        stale = asyncio.ensure_future(probe.probe())
        await first_call.wait()
        probe.cancel()
        assert not probe.in_flight
        fresh = await probe.probe()
        assert fresh.ok and calls == 2
        with pytest.raises(asyncio.CancelledError):
            await stale


@pytest.mark.parametrize(
    ("transport", "expected"),
    [
        (answering(200, b'{"internal_states": [{"avg_spec_accept_length": 2.5}]}'), "data"),
        (answering(200, b"{not json"), "invalid JSON"),
        (answering(200, b"\xff\xfe\x00"), "invalid JSON"),
        (answering(200, b"[" * 100_000), "invalid JSON (nested too deep)"),
        (answering(404, b"{}"), "HTTP 404"),
        (answering(200, b" " * (4 * 1024 * 1024 + 1)), "body over 4194304 bytes"),
        (raising(httpx.ReadTimeout("timed out")), "timeout"),
    ],
)
async def test_get_json(transport: httpx.MockTransport, expected: str) -> None:
    async with mock_client(transport) as client:
        probe = HealthProbe("http://h", "/health", 1.0, client=client)
        reply = await probe.get_json("/get_server_info", timeout_s=0.5)
    if expected == "data":
        assert reply.ok and reply.data == {"internal_states": [{"avg_spec_accept_length": 2.5}]}
    else:
        assert reply.data is None and not reply.ok
        assert reply.error == expected


def test_helpers() -> None:
    assert join_url("http://h:1/", "/metrics") == "http://h:1/metrics"
    assert join_url("http://h:1", "metrics") == "http://h:1/metrics"
    assert describe_error(asyncio.TimeoutError()) == "timeout"
    assert describe_error(ValueError()) == "ValueError"
    assert make_client().trust_env is False


# --- a real server on a random port ------------------------------------------------------------

BIG_CHUNK = b"x" * (1024 * 1024)


class Handler(QuietHandler):
    def do_GET(self) -> None:
        path = self.path
        if path == "/health":
            self.reply(200, b"")
        elif path == "/slow":
            self.server.stop.wait(10.0)  # far longer than the probe's 0.3 s timeout; teardown ends it
            self.reply(200, b"")
        elif path == "/unavailable":
            self.reply(503, b"")
        elif path == "/close":
            self.close_connection = True  # close without writing anything
        elif path == "/reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
        elif path == "/garbage":
            self.wfile.write(b"\x00\xffTHIS IS NOT HTTP\r\n\r\n")
            self.close_connection = True
        elif path == "/json":
            self.reply(200, json.dumps({"internal_states": [{"avg_spec_accept_length": 3.0}]}).encode())
        elif path == "/huge":
            self.send_response(200)
            self.send_header("Content-Length", str(50 * len(BIG_CHUNK)))
            self.end_headers()
            try:
                for _ in range(50):
                    self.wfile.write(BIG_CHUNK)
            except OSError:
                pass  # the client stopped reading, as it should
            self.close_connection = True
        else:
            self.reply(404, b"not found")


@pytest.fixture
def server() -> Iterator[str]:
    with serving(Handler) as url:
        yield url


# The probe's timeout is generous (a loaded CI machine can take a good fraction of a second to
# answer anything) except for /slow, whose whole point is the timeout; its server waits far longer.
@pytest.mark.parametrize(
    ("path", "timeout_s", "ok", "status", "error"),
    [
        ("/health", 5.0, True, 200, ""),
        ("/unavailable", 5.0, False, 503, "HTTP 503"),
        ("/slow", 0.3, False, None, "timeout"),
        ("/close", 5.0, False, None, "connection closed without a response"),
        ("/reset", 5.0, False, None, ""),  # reset or closed, depending on timing: only "not ok" is certain
        ("/garbage", 5.0, False, None, "invalid HTTP response"),
        ("/huge", 5.0, False, 200, "body over 65536 bytes"),
    ],
)
async def test_health_against_a_real_server(
    server: str, path: str, timeout_s: float, ok: bool, status: int | None, error: str
) -> None:
    probe = HealthProbe(server, path, timeout_s)
    try:
        started = time.monotonic()
        obs = await probe.probe()
        elapsed = time.monotonic() - started
    finally:
        await probe.aclose()
    assert (obs.ok, obs.status_code) == (ok, status)
    if error:
        assert obs.error.startswith(error)
    else:
        assert obs.error != "" or ok
    assert elapsed < timeout_s + 3.0  # for /slow (server waits 10 s): the probe gave up at its timeout
    assert obs.latency_s <= elapsed + 0.01


async def test_connection_refused_against_a_closed_port() -> None:
    probe = HealthProbe(f"http://127.0.0.1:{free_port()}", "/health", 0.3)
    try:
        obs = await probe.probe()
    finally:
        await probe.aclose()
    assert (obs.ok, obs.status_code, obs.error) == (False, None, "connection refused")


async def test_get_json_against_a_real_server(server: str) -> None:
    probe = HealthProbe(server, "/health", 5.0)
    try:
        good = await probe.get_json("/json", timeout_s=5.0)
        slow = await probe.get_json("/slow", timeout_s=0.3)
        missing = await probe.get_json("/nothing", timeout_s=5.0)
    finally:
        await probe.aclose()
    assert good == JsonReply({"internal_states": [{"avg_spec_accept_length": 3.0}]}, 200, "", good.latency_s)
    assert (slow.error, missing.error) == ("timeout", "HTTP 404")


async def test_fetch_stops_reading_a_huge_body(server: str) -> None:
    async with make_client() as client:
        got = await fetch(client, f"{server}/huge", 5.0, max_bytes=2 * 1024 * 1024)
    assert (got.status_code, got.body, got.error) == (200, b"", "body over 2097152 bytes")
