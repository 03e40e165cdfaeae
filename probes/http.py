"""HTTP probes of the server: the health endpoint (one request at a time) and JSON reads.

Every request has a hard deadline (the client's timeouts and an overall `asyncio.wait_for`, since
httpx's timeouts apply per read and a server dripping bytes would outlive them) and a cap on the
body it reads. Nothing here raises: a failure is an observation with a short `error`.
"""

from __future__ import annotations

import asyncio
import errno
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from probes.types import HealthObservation

MAX_HEALTH_BODY_BYTES = 64 * 1024
MAX_JSON_BYTES = 4 * 1024 * 1024
_ERROR_CHARS = 200


@dataclass(frozen=True)
class Fetched:
    status_code: int | None  # None when no response came back
    body: bytes
    error: str  # "" when a whole response (of any status) came back within the limits
    latency_s: float


@dataclass(frozen=True)
class JsonReply:
    data: object | None  # the decoded JSON; None unless `error` is ""
    status_code: int | None
    error: str  # "" on a 200 with valid JSON; "timeout", "HTTP 404", "invalid JSON", ...
    latency_s: float

    @property
    def ok(self) -> bool:
        return not self.error


def make_client() -> httpx.AsyncClient:
    """A client for local probes: no proxies from the environment (a proxy would eat localhost)."""
    return httpx.AsyncClient(trust_env=False, follow_redirects=False)


def join_url(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + "/" + path.lstrip("/")


def describe_error(err: BaseException) -> str:
    """A short, stable description of why a request failed."""
    if isinstance(err, (asyncio.TimeoutError, httpx.TimeoutException)):
        return "timeout"
    text = str(err)
    if isinstance(err, httpx.ConnectError):
        if "refused" in text.lower() or _errno_of(err) == errno.ECONNREFUSED:
            return "connection refused"
        return f"connect failed: {text}"[:_ERROR_CHARS]
    if isinstance(err, httpx.RemoteProtocolError):
        if "without sending" in text or "disconnected" in text:
            return "connection closed without a response"
        return f"invalid HTTP response: {text}"[:_ERROR_CHARS]
    if isinstance(err, httpx.ReadError):
        return "connection reset" if "reset" in text.lower() or not text else f"read failed: {text}"[:_ERROR_CHARS]
    return f"{type(err).__name__}: {text}"[:_ERROR_CHARS] if text else type(err).__name__


def _errno_of(err: BaseException) -> int | None:
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno is not None:
            return cause.errno
        cause = cause.__cause__ or cause.__context__
    return None


async def fetch(
    client: httpx.AsyncClient,
    url: str,
    timeout_s: float,
    max_bytes: int,
    monotonic: Callable[[], float] = time.monotonic,
    *,
    method: str = "GET",
    body: bytes | None = None,
) -> Fetched:
    """GET `url` (or `method` with a JSON `body`), reading at most `max_bytes` of body, finished or
    abandoned within `timeout_s`."""
    started = monotonic()
    headers = {"Content-Type": "application/json"} if body is not None else None

    async def go() -> Fetched:
        async with client.stream(method, url, content=body, headers=headers, timeout=httpx.Timeout(timeout_s)) as resp:
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    error = f"body over {max_bytes} bytes"
                    return Fetched(resp.status_code, b"", error, monotonic() - started)
                chunks.append(chunk)
            return Fetched(resp.status_code, b"".join(chunks), "", monotonic() - started)

    try:
        return await asyncio.wait_for(go(), timeout_s)
    except Exception as err:  # never raise: every failure is an observation
        return Fetched(None, b"", describe_error(err), monotonic() - started)


@dataclass(frozen=True)
class Canary:
    """A one-token generation that proves an engine whose /health is only a flag (vLLM) can generate."""

    path: str
    body: str  # JSON


class HealthProbe:
    """Probes the server's health endpoint, never two requests in flight.

    A `probe()` while one is running awaits that same request and returns its result, so a slow
    health answer (SGLang's takes ~1 s when healthy, ~20 s to fail when hung) is never stacked.
    """

    def __init__(
        self,
        base_url: str,
        path: str,
        timeout_s: float,
        client: httpx.AsyncClient | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        canary: Canary | None = None,
    ) -> None:
        self.url = join_url(base_url, path)
        self.canary = canary
        self._base_url = base_url
        self._timeout_s = timeout_s
        self._client = client or make_client()
        self._owns_client = client is None
        self._monotonic = monotonic
        self._task: asyncio.Task[HealthObservation] | None = None
        self._abandoned: set[asyncio.Task[HealthObservation]] = set()  # cancelled, maybe not yet ended

    @property
    def in_flight(self) -> bool:
        return self._task is not None and not self._task.done()

    async def probe(self, canary: bool = False) -> HealthObservation:
        """The health endpoint's answer; with `canary` (and a canary configured), then one generation."""
        task = self._task
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._probe_once(canary))
            self._task = task
        # shield: a caller cancelled while waiting does not cancel the request others wait on
        return await asyncio.shield(task)

    async def get_json(self, path: str, timeout_s: float, max_bytes: int = MAX_JSON_BYTES) -> JsonReply:
        """GET a JSON endpoint such as `/get_server_info`, which blocks forever on a hung scheduler
        unless the client gives up: always bounded by `timeout_s`."""
        got = await fetch(self._client, join_url(self._base_url, path), timeout_s, max_bytes, self._monotonic)
        if got.error:
            return JsonReply(None, got.status_code, got.error, got.latency_s)
        if got.status_code != 200:
            return JsonReply(None, got.status_code, f"HTTP {got.status_code}", got.latency_s)
        try:
            data: object = json.loads(got.body)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            return JsonReply(None, got.status_code, "invalid JSON", got.latency_s)
        except RecursionError:
            return JsonReply(None, got.status_code, "invalid JSON (nested too deep)", got.latency_s)
        return JsonReply(data, got.status_code, "", got.latency_s)

    def cancel(self) -> None:
        """Abandon the request in flight (a relaunch: its answer would describe the old server).
        Callers awaiting it get CancelledError; the next `probe()` starts a fresh request."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            self._abandoned.add(task)
            task.add_done_callback(self._abandoned.discard)
        self._task = None

    async def aclose(self) -> None:
        """Close the client once every request on it has ended, the abandoned ones included: a
        client closed under a request that was still connecting leaks that connection's socket."""
        self.cancel()
        if self._abandoned:
            await asyncio.gather(*self._abandoned, return_exceptions=True)
        if self._owns_client:
            await self._client.aclose()

    async def _probe_once(self, canary: bool = False) -> HealthObservation:
        got = await fetch(self._client, self.url, self._timeout_s, MAX_HEALTH_BODY_BYTES, self._monotonic)
        ok = got.status_code == 200 and not got.error
        error = got.error or ("" if ok else f"HTTP {got.status_code}")
        if ok and canary and self.canary is not None:
            return await self._generate(self.canary, got.latency_s)
        return HealthObservation(
            at=self._monotonic(), ok=ok, status_code=got.status_code, latency_s=got.latency_s, error=error
        )

    async def _generate(self, canary: Canary, flag_latency_s: float) -> HealthObservation:
        """The canary: 200 with at least one choice, within what is left of the health timeout."""
        url = join_url(self._base_url, canary.path)
        left = max(self._timeout_s - flag_latency_s, 1.0)
        got = await fetch(
            self._client, url, left, MAX_HEALTH_BODY_BYTES, self._monotonic, method="POST", body=canary.body.encode()
        )
        ok, error = got.status_code == 200 and not got.error, got.error
        if ok:
            try:
                doc = json.loads(got.body)
                ok = isinstance(doc, dict) and bool(doc.get("choices"))
            except (ValueError, RecursionError):
                ok = False
            error = "" if ok else "canary generation answered without a choice"
        elif not error:
            error = f"canary generation: HTTP {got.status_code}"
        else:
            error = f"canary generation: {error}"
        return HealthObservation(
            at=self._monotonic(), ok=ok, status_code=got.status_code,
            latency_s=flag_latency_s + got.latency_s, error=error,
        )  # fmt: skip
