"""Fixtures that run the whole daemon in-process against the real simulator (real processes, ports, HTTP)."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor.config import Settings, settings_from_mapping
from supervisor.daemon import Supervisor
from supervisor.runner import serve
from supervisor.snapshot import StatusSnapshot


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def sim_settings(
    tmp_path: Path,
    scenario: str = "ok",
    *,
    tp: int = 2,
    env: dict[str, str] | None = None,
    args: dict[str, Any] | None = None,
    fallback: list[dict[str, Any]] | None = None,
    watchdog: dict[str, Any] | None = None,
    restart: dict[str, Any] | None = None,
    diagnostics: dict[str, Any] | None = None,
    api: dict[str, Any] | None = None,
) -> Settings:
    sim_env = {
        "SGLANG_SIM_SCENARIO": scenario,
        "SGLANG_SIM_PACE": "0.15",
        "SGLANG_SIM_HEALTH_LATENCY_S": "0.05",
        "SGLANG_SIM_FAULT_AFTER_S": "1.5",
        "SGLANG_HEALTH_CHECK_TIMEOUT": "2",
    }
    sim_env.update(env or {})
    data: dict[str, Any] = {
        "server": {
            "command": [sys.executable, "-m", "supervisor.simulator"],
            "port": free_port(),
            "env": sim_env,
            "args": {"model-path": str(tmp_path / "model"), "tp-size": tp, "enable-metrics": True, **(args or {})},
        },
        "fallback": fallback or [],
        "watchdog": {
            "poll_interval_s": 0.5,
            "startup_stall_s": 4.0,
            "startup_timeout_s": 120.0,
            "cpu_only_stall_s": 8.0,
            "health_interval_s": 1.0,
            "health_timeout_s": 4.0,
            "health_failures": 2,
            "serving_stall_s": 4.0,
            "spec_window_s": 4.0,
            **(watchdog or {}),
        },
        "restart": {
            "retries_per_rung": 0,
            "backoff_initial_s": 0.2,
            "backoff_max_s": 2.0,
            "stop_grace_s": 3.0,
            "release_timeout_s": 2.0,
            "start_from": "preferred",
            **(restart or {}),
        },
        "diagnostics": {"native": False, "gdb": "never", "py_spy_timeout_s": 10.0, **(diagnostics or {})},
        "api": {"port": free_port(), **(api or {})},
        "paths": {"state_dir": str(tmp_path / "state")},
    }
    return settings_from_mapping(data)


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
        from supervisor.commands import Command

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
