"""A server that serves, for integration tests: a bounded `/generate` load, the speculative-decoding
arguments, and the predicate "the daemon says ready"."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

SPEC = {"speculative-algorithm": "EAGLE3", "speculative-draft-model-path": "/models/draft"}


@contextlib.asynccontextmanager
async def traffic(port: int, concurrency: int = 2, tokens: int = 24) -> AsyncIterator[list[int]]:
    """A bounded load generator: `concurrency` clients posting /generate until the block ends."""
    done: list[int] = []
    stop = asyncio.Event()

    async def client() -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            while not stop.is_set():
                try:
                    r = await c.post(
                        f"http://127.0.0.1:{port}/generate",
                        json={"text": "hello", "sampling_params": {"max_new_tokens": tokens}},
                    )
                    if r.status_code == 200:
                        done.append(1)
                except httpx.HTTPError:
                    await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(client()) for _ in range(concurrency)]
    try:
        yield done
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def ready(s: Any) -> bool:
    """A status (snapshot or `/status` document read as attributes) in state `ready`."""
    return bool(s.state == "ready")
