"""The leader's client for its members' APIs: concurrent requests, one timeout each, never raises;
signed both ways and bounded in size (supervisor/group/signing.py).

Every member is asked at once (`asyncio.gather`), so one slow or partitioned node costs the leader
one timeout, not one per node. The transport is injectable (httpx.MockTransport in unit tests).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from supervisor.group.credentials import GroupKeys
from supervisor.group.signing import MAX_ANSWER_BYTES, check_answer, sign_request


@dataclass(frozen=True)
class Answer:
    node: int
    address: str
    ok: bool  # a 2xx with a JSON object
    status: int | None = None  # HTTP status, None when no answer came
    body: Mapping[str, Any] = field(default_factory=dict)
    error: str = ""  # why not ok, in words
    elapsed_s: float = 0.0


def base_url(address: str) -> str:
    return f"http://{address}"


class _TooLarge(Exception):
    pass


class GroupClient:
    """Signs every request with the member's own key (never the operator's bearer token), reads at
    most `max_answer_bytes` of an answer (streaming: a larger one is cut off and refused), and
    accepts an answer only when that member's key signed it for this request."""

    def __init__(
        self,
        members: Mapping[int, str],
        keys: GroupKeys,
        *,
        wall: Callable[[], float] = time.time,
        max_skew_s: float = 30.0,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        transport: httpx.AsyncBaseTransport | None = None,
        as_node: int | None = None,
    ) -> None:
        self.members = dict(members)
        self.keys = keys
        self._as_node = as_node  # a worker asking its leader signs as itself, with its own key
        self._wall = wall
        self._max_skew_s = max_skew_s
        self._max_bytes = max_answer_bytes
        # No connection reuse across polls: a member daemon that restarted must be reached afresh.
        self._client = httpx.AsyncClient(
            headers={"X-Requested-By": "sglang-supervisor"},  # a POST without a body needs it (api/browser.py)
            transport=transport,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def _exchange(self, node: int, method: str, path: str, body: bytes, timeout: float) -> tuple[int, bytes, str]:
        """(status, body, why refused): the member's answer, read bounded and checked."""
        signer = node if self._as_node is None else self._as_node
        key = self.keys.key(signer)
        signed = sign_request(key, signer, method, path, body, self._wall())
        headers = {**signed.headers(), "content-type": "application/json"}
        url = base_url(self.members[node]) + path
        async with self._client.stream(method, url, content=body, headers=headers, timeout=timeout) as resp:
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._max_bytes:
                raise _TooLarge(f"answer of {int(declared)} bytes, over {self._max_bytes}")
            data = await self._bounded(resp)
            why = check_answer(
                key, signer, method, path, signed.nonce, resp.status_code, data, resp.headers, self._wall(),
                self._max_skew_s,
            )
            return resp.status_code, data, why

    async def _bounded(self, resp: httpx.Response) -> bytes:
        if resp.is_stream_consumed:  # an in-memory answer (a test's transport): already whole
            data = resp.content
        else:
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_raw():
                size += len(chunk)
                if size > self._max_bytes:
                    raise _TooLarge(f"answer over {self._max_bytes} bytes (cut off)")
                chunks.append(chunk)
            data = b"".join(chunks)
        if len(data) > self._max_bytes:
            raise _TooLarge(f"answer over {self._max_bytes} bytes (cut off)")
        return data

    async def _one(self, node: int, method: str, path: str, body: Mapping[str, Any] | None, timeout: float) -> Answer:
        address = self.members[node]
        t0 = time.monotonic()
        raw = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
        try:
            status, data, why = await asyncio.wait_for(self._exchange(node, method, path, raw, timeout), timeout + 1.0)
        except _TooLarge as err:
            return Answer(node, address, False, error=str(err), elapsed_s=time.monotonic() - t0)
        except (httpx.HTTPError, OSError, asyncio.TimeoutError) as err:
            what = type(err).__name__ if not str(err) else f"{type(err).__name__}: {err}"
            return Answer(node, address, False, error=what[:300], elapsed_s=time.monotonic() - t0)
        elapsed = time.monotonic() - t0
        if why:  # not this member's answer (or none of its): nothing in it is read
            return Answer(node, address, False, status, error=why[:300], elapsed_s=elapsed)
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return Answer(node, address, False, status, error="answer is not a JSON object", elapsed_s=elapsed)
        if not 200 <= status < 300:
            detail = str(doc.get("detail") or doc.get("error") or "")[:300]
            return Answer(node, address, False, status, doc, f"HTTP {status} {detail}", elapsed)
        return Answer(node, address, True, status, doc, elapsed_s=elapsed)

    async def ask(
        self, node: int, method: str, path: str, *, timeout: float, body: Mapping[str, Any] | None = None
    ) -> Answer:
        """One request to one member."""
        return await self._one(node, method, path, body, timeout)

    async def ask_all(
        self, method: str, path: str, *, timeout: float, body: Mapping[str, Any] | None = None
    ) -> tuple[Answer, ...]:
        """The same request to every member at once; answers in rank order."""
        nodes = sorted(self.members)
        return tuple(await asyncio.gather(*(self._one(n, method, path, body, timeout) for n in nodes)))
