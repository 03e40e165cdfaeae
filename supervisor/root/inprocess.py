"""The daemon in this process's event loop, for programs that embed it (benchmarks, the demo): the
composition root (`serve`) started as a task, and a small handle to read its status and stop it.

`sglang-supervisor run` is the daemon's face for operators; this is the face for code. The handle
offers what the API offers (`snapshot`, `submit`) plus the marker the server tree carries, so a
caller can clean up after a crash; nothing of the supervisor's insides.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.common.waiting import wait_for_async
from supervisor.config.settings import Settings
from supervisor.root.serve import serve
from supervisor.status.commands import Command, CommandResult, SupervisorHandle
from supervisor.status.snapshot import StatusSnapshot

__all__ = ["Command", "CommandResult", "InProcessDaemon", "StatusSnapshot", "start_in_process"]


@dataclass
class InProcessDaemon:
    """A running daemon: its status, its commands, and its exit status once `task` ends."""

    task: asyncio.Task[int]
    settings: Settings
    _handle: SupervisorHandle
    marker: str  # the environment marker of every process of the server tree (probes.proctree)
    _requests: set[asyncio.Future[CommandResult]] = field(default_factory=set)

    def snapshot(self) -> StatusSnapshot:
        return self._handle.snapshot()

    async def submit(self, command: Command) -> CommandResult:
        return await self._handle.submit(command)

    def request(self, command: Command) -> None:
        """Enqueue `command` without waiting for its outcome (as a signal handler does)."""
        fut = asyncio.ensure_future(self._handle.submit(command))
        self._requests.add(fut)
        fut.add_done_callback(self._requests.discard)

    async def wait_for(
        self, pred: Callable[[StatusSnapshot], bool], timeout: float, what: str, interval: float = 0.05
    ) -> StatusSnapshot:
        """The first snapshot for which `pred` holds; TimeoutError naming `what` and the last state."""

        def matched(snap: StatusSnapshot) -> bool:
            if pred(snap):
                return True
            if self.task.done():
                self.task.result()
                raise RuntimeError(f"the daemon exited while waiting for {what}")
            return False

        def show(snap: StatusSnapshot) -> str:
            return f"state {snap.state} ({snap.reason})"

        return await wait_for_async(self.snapshot, matched, timeout, what=what, interval=interval, show=show)

    async def stop(self, timeout: float = 120.0) -> int:
        """Shut the daemon down (it stops the server tree on the way out) and return its exit status."""
        if not self.task.done():
            self.request(Command(kind="shutdown", source="embedder"))
        try:
            return await asyncio.wait_for(asyncio.shield(self.task), timeout=timeout)
        finally:
            for fut in list(self._requests):  # a daemon that exited answers nothing more
                fut.cancel()


async def start_in_process(
    settings: Settings,
    *,
    env: Mapping[str, str] | None = None,
    config_path: Path | None = None,
    signals: bool = False,
    start_timeout: float = 30.0,
) -> InProcessDaemon:
    """Start the daemon as a task of the running loop; returns once its loop and API run.

    `signals=True` installs the daemon's SIGTERM/SIGINT/SIGHUP/SIGUSR2 handlers, as `run` does.
    Raises what the daemon raised when it could not start (a locked state directory, a busy port).
    """
    from supervisor.daemon.owner import Owner

    holder: list[Owner] = []
    ready = asyncio.Event()
    task = asyncio.create_task(
        serve(
            settings,
            env=dict(os.environ) if env is None else env,
            config_path=config_path,
            ready=ready,
            holder=holder,
            signals=signals,
        )
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED, timeout=start_timeout)
    waiter.cancel()
    if task.done():
        task.result()
        raise RuntimeError("the daemon exited before it was ready")
    if not holder:
        task.cancel()
        raise TimeoutError(f"the daemon was not ready within {start_timeout:.0f} s")
    sup = holder[0]
    return InProcessDaemon(task=task, settings=settings, _handle=sup, marker=sup.marker)
