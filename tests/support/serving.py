"""A server that serves, for integration tests: a bounded `/generate` load, the speculative-decoding
arguments, and the predicate "the daemon says ready"."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

SPEC = {"speculative-algorithm": "EAGLE3", "speculative-draft-model-path": "/models/draft"}
# vLLM's way of saying the same (`--speculative-config` takes JSON)
VLLM_SPEC = {"speculative-config": '{"method": "eagle3", "model": "/models/draft", "num_speculative_tokens": 3}'}


@contextlib.asynccontextmanager
async def traffic(
    port: int, concurrency: int = 2, tokens: int = 24, engine: str = "sglang"
) -> AsyncIterator[list[int]]:
    """A bounded load generator: `concurrency` clients posting SGLang's /generate (vLLM's
    /v1/completions with `engine="vllm"`) until the block ends."""
    done: list[int] = []
    stop = asyncio.Event()
    path, body = (
        ("/v1/completions", {"prompt": "hello", "max_tokens": tokens})
        if engine == "vllm"
        else ("/generate", {"text": "hello", "sampling_params": {"max_new_tokens": tokens}})
    )

    async def client() -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            while not stop.is_set():
                try:
                    r = await c.post(f"http://127.0.0.1:{port}{path}", json=body)
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
