"""Commands for the supervisor: the API, the signal handlers and the CLI only enqueue these.

One supervisor task consumes the queue; nothing else touches processes. Each command carries a
future the submitter may await for the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from supervisor.status.snapshot import StatusSnapshot

CommandKind = Literal["restart", "stop", "start", "diagnose", "reload", "shutdown", "handoff"]
Outcome = Literal["accepted", "done", "conflict", "busy", "invalid", "failed"]


@dataclass(frozen=True)
class CommandResult:
    outcome: Outcome
    message: str = ""
    state: str = ""
    incident_id: str | None = None
    bundle_id: str | None = None
    summary: dict[str, object] | None = None  # a diagnostics bundle's summary.json, for /diagnose


@dataclass(frozen=True)
class Command:
    kind: CommandKind
    rung: str | None = None  # restart: go straight to this rung
    reason: str = ""
    diagnose: bool = False  # restart: capture evidence first
    native: bool | None = None  # diagnose: py-spy --native (None: the configured default)
    gdb: bool | None = None  # diagnose: force gdb even on a healthy server
    source: str = "api"  # "api", "signal", "cli", "group" (the group's leader)
    requested_by: str = ""  # api: the bearer, a page session or anonymous, and the client's address
    incident_id: str | None = None  # diagnose: the group leader's incident id (supervisor/group)
    done: asyncio.Future[CommandResult] | None = field(default=None, compare=False)


def finish(cmd: Command, result: CommandResult) -> None:
    """Answer a command's submitter (once; later answers are ignored)."""
    if cmd.done is not None and not cmd.done.done():
        cmd.done.set_result(result)


class SupervisorHandle(Protocol):
    """What the API sees of the supervisor."""

    def snapshot(self) -> StatusSnapshot: ...

    async def submit(self, command: Command) -> CommandResult: ...


async def next_from(
    queue: asyncio.Queue[Command], sleep: Callable[[float], Awaitable[None]], timeout: float
) -> Command | None:
    """The next queued command, or None once `timeout` has passed on the injected clock's `sleep`."""
    if timeout <= 0:
        try:
            return queue.get_nowait()
        except asyncio.QueueEmpty:
            return None
    get = asyncio.ensure_future(queue.get())
    timer = asyncio.ensure_future(sleep(timeout))
    await asyncio.wait({get, timer}, return_when=asyncio.FIRST_COMPLETED)
    timer.cancel()
    if not get.done():
        get.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await get
    return get.result() if get.done() and not get.cancelled() else None


def fail_queued(queue: asyncio.Queue[Command], why: str, state: str) -> None:
    """Every command still queued when the loop ends is answered, never left waiting."""
    while not queue.empty():
        finish(queue.get_nowait(), CommandResult("failed", why, state))
