"""Fixtures that run the whole daemon in-process against the real simulator (real processes, ports, HTTP)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from simconfig import sim_settings

from supervisor.common.waiting import wait_for_async
from supervisor.config.settings import Settings
from supervisor.root.serve import serve
from supervisor.status.commands import Command, CommandResult, SupervisorHandle
from supervisor.status.snapshot import StatusSnapshot


@dataclass
class Running:
    """The daemon running in this test's event loop, met as its users meet it: its status (`snap`,
    the same snapshot `GET /status` answers), its commands (`submit`, as the API sends them), its
    API at `api`, its journal and files under `settings.state_dir`, its exit status (`task`)."""

    handle: SupervisorHandle  # what the API reads of the owner: snapshot() and submit()
    settings: Settings
    task: asyncio.Task[int]
    api: str
    # The owner object itself, for the few tests that inject a fault inside the running daemon (an
    # exception in a poll or a stop, an unreadable /proc, a stuck loop; see test_daemon_survives and
    # test_daemon_process): the public contract has no door for those. Nothing else reads it.
    owner: Any  # supervisor.daemon.owner's class, not imported: the tests do not depend on its name

    async def submit(self, command: Command) -> CommandResult:
        return await self.handle.submit(command)

    def snap(self) -> StatusSnapshot:
        return self.handle.snapshot()

    async def wait_for(self, pred: Callable[[StatusSnapshot], bool], timeout: float, what: str = "") -> StatusSnapshot:
        def matched(s: StatusSnapshot) -> bool:
            if pred(s):
                return True
            if self.task.done():
                self.task.result()
                raise AssertionError(f"daemon exited while waiting for {what}")
            return False

        return await wait_for_async(
            self.snap, matched, timeout, what=what, show=lambda s: s.model_dump_json()[:1500]
        )

    async def stop(self) -> int:
        shutdown = Command(kind="shutdown", source="test")
        asked = None if self.task.done() else asyncio.ensure_future(self.submit(shutdown))
        try:
            return await asyncio.wait_for(self.task, timeout=30)
        finally:
            if asked is not None:
                asked.cancel()  # a daemon that exited answers nothing more


@pytest.fixture
async def daemon() -> AsyncIterator[Callable[[Settings], Any]]:
    started: list[Running] = []

    async def start(settings: Settings, env: dict[str, str] | None = None, config_path: Path | None = None) -> Running:
        """`config_path`: the file `POST /reload` (SIGHUP) re-reads; None: the daemon has none."""
        import os

        holder: list[Any] = []  # the composition root hands the owner out here
        ready = asyncio.Event()
        task = asyncio.create_task(
            serve(
                settings,
                env=env if env is not None else dict(os.environ),
                config_path=config_path,
                ready=ready,
                holder=holder,
                signals=False,
            )
        )
        await asyncio.wait({task, asyncio.create_task(ready.wait())}, return_when=asyncio.FIRST_COMPLETED, timeout=15)
        if task.done():
            task.result()
        r = Running(holder[0], settings, task, f"http://127.0.0.1:{settings.api.port}", owner=holder[0])
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


@pytest.fixture
def made() -> Iterator[list[Any]]:
    """Group nodes (tests/support/groupdaemons.Node) a test started: cleaned up, last first."""
    nodes: list[Any] = []
    yield nodes
    for n in reversed(nodes):
        n.cleanup()


@pytest.fixture
def nodes_of(tmp_path: Path) -> Iterator[Callable[..., list[Any]]]:
    """`nodes_of(...)` -> a group's daemons (tests/support/groupdaemons.group_of), started; cleaned up,
    last first."""
    from groupdaemons import group_of

    made: list[Any] = []

    def make(*args: Any, **kw: Any) -> list[Any]:
        nodes = group_of(tmp_path, *args, **kw)
        made.extend(nodes)
        for n in nodes:
            n.start()
        return nodes

    yield make
    for n in reversed(made):
        n.cleanup()
