"""Fixtures that run the whole daemon in-process against the real simulator (real processes, ports, HTTP)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from simsupport import sim_settings

from supervisor.config.settings import Settings
from supervisor.daemon.owner import Supervisor
from supervisor.root.serve import serve
from supervisor.status.snapshot import StatusSnapshot


@dataclass
class Running:
    sup: Supervisor
    settings: Settings
    task: asyncio.Task[int]
    api: str

    def snap(self) -> StatusSnapshot:
        return self.sup.snapshot()

    async def wait_for(self, pred: Callable[[StatusSnapshot], bool], timeout: float, what: str = "") -> StatusSnapshot:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.snap()
            if pred(s):
                return s
            if self.task.done():
                self.task.result()
                raise AssertionError(f"daemon exited while waiting for {what}")
            await asyncio.sleep(0.1)
        raise AssertionError(
            f"timed out after {timeout} s waiting for {what}; last: {self.snap().model_dump_json()[:1500]}"
        )

    async def stop(self) -> int:
        from supervisor.status.commands import Command

        if not self.task.done():
            self.sup.queue.put_nowait(Command(kind="shutdown", source="test"))
        return await asyncio.wait_for(self.task, timeout=30)


@pytest.fixture
async def daemon() -> AsyncIterator[Callable[[Settings], Any]]:
    started: list[Running] = []

    async def start(settings: Settings, env: dict[str, str] | None = None) -> Running:
        import os

        holder: list[Supervisor] = []
        ready = asyncio.Event()
        task = asyncio.create_task(
            serve(
                settings,
                env=env if env is not None else dict(os.environ),
                config_path=None,
                ready=ready,
                holder=holder,
                signals=False,
            )
        )
        await asyncio.wait({task, asyncio.create_task(ready.wait())}, return_when=asyncio.FIRST_COMPLETED, timeout=15)
        if task.done():
            task.result()
        r = Running(holder[0], settings, task, f"http://127.0.0.1:{settings.api.port}")
        started.append(r)
        await r.wait_for(lambda x: x.state != "stopped", 15, "the first launch")
        return r

    yield start
    for r in started:
        await r.stop()


async def get_json(url: str, **kw: Any) -> Any:
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.get(url, **kw)
        return r.json()


@pytest.fixture
def sim(tmp_path: Path) -> Callable[..., Settings]:
    """`sim("deadlock_after_load", watchdog={...})` -> Settings for the simulator in this test's tmp dir."""

    def make(scenario: str = "ok", **kw: Any) -> Settings:
        return sim_settings(tmp_path, scenario, **kw)

    return make
