"""The leader's client for its members' APIs: concurrent requests, one timeout each, never raises.

Every member is asked at once (`asyncio.gather`), so one slow or partitioned node costs the leader
one timeout, not one per node. The transport is injectable (httpx.MockTransport in unit tests).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx


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


class GroupClient:
    def __init__(
        self,
        members: Mapping[int, str],
        token: str | None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.members = dict(members)
        headers = {"X-Requested-By": "sglang-supervisor"}  # a POST without a body needs it (api/browser.py)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # No connection reuse across polls: a member daemon that restarted must be reached afresh.
        self._client = httpx.AsyncClient(
            headers=headers, transport=transport, limits=httpx.Limits(max_keepalive_connections=0)
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def _one(self, node: int, method: str, path: str, body: Mapping[str, Any] | None, timeout: float) -> Answer:
        address = self.members[node]
        t0 = time.monotonic()
        try:
            resp = await asyncio.wait_for(
                self._client.request(method, base_url(address) + path, json=body, timeout=timeout), timeout + 1.0
            )
        except (httpx.HTTPError, OSError, asyncio.TimeoutError) as err:
            what = type(err).__name__ if not str(err) else f"{type(err).__name__}: {err}"
            return Answer(node, address, False, error=what[:300], elapsed_s=time.monotonic() - t0)
        elapsed = time.monotonic() - t0
        try:
            doc = resp.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return Answer(
                node, address, False, resp.status_code, error="answer is not a JSON object", elapsed_s=elapsed
            )
        if not 200 <= resp.status_code < 300:
            detail = str(doc.get("detail") or doc.get("error") or "")[:300]
            return Answer(node, address, False, resp.status_code, doc, f"HTTP {resp.status_code} {detail}", elapsed)
        return Answer(node, address, True, resp.status_code, doc, elapsed_s=elapsed)

    async def ask_all(
        self, method: str, path: str, *, timeout: float, body: Mapping[str, Any] | None = None
    ) -> tuple[Answer, ...]:
        """The same request to every member at once; answers in rank order."""
        nodes = sorted(self.members)
        return tuple(await asyncio.gather(*(self._one(n, method, path, body, timeout) for n in nodes)))
