"""An in-memory `SupervisorHandle` for tests of the API and the CLI client (tests only, not shipped).

It answers the way the supervisor's queue does: one restart at a time (a second is a conflict),
one capture at a time (a second is busy), stop/start refused when already there, unknown rungs
invalid. `hold_capture` keeps a capture open until `release_capture` is set, to test what the API
does while one runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI

from api.deps import get_supervisor
from supervisor.status.commands import Command, CommandResult, SupervisorHandle
from supervisor.status.snapshot import GpuDeviceView, GpuView, IncidentView, ProgressView, ServingView, StatusSnapshot

SAMPLE_LADDER = ("base", "no-cuda-graph", "no-spec")


def sample_snapshot(**changes: Any) -> StatusSnapshot:
    """A plausible snapshot of a serving 1-GPU server, with `changes` applied."""
    snap = StatusSnapshot(
        state="ready",
        rung="base",
        rung_index=0,
        last_good_rung="base",
        pid=4242,
        restarts=2,
        restarts_last_hour=1,
        last_progress_s=1.5,
        since="2025-01-01T00:00:00Z",
        time_to_ready_s=61.0,
        last_incident=IncidentView(
            id="20250101T000000Z-startup_stall",
            cause="startup_stall",
            hang_class="idle_deadlock",
            at="2025-01-01T00:00:00Z",
            rung="base",
            bundle="20250101T000000Z-startup_stall",
        ),
        incidents=1,
        serving=ServingView(
            health_ok=True,
            health_latency_s=0.012,
            running_reqs=3,
            queue_reqs=0,
            token_rate=512.0,
            spec_accept_length=3.1,
            metrics_available=True,
        ),
        gpu=GpuView(
            status="ok",
            devices=(
                GpuDeviceView(
                    index=0,
                    uuid="GPU-5f1c7d2e-0000-0000-0000-000000000000",
                    name="NVIDIA H200",
                    util_percent=95.0,
                    mem_used_bytes=120 * 2**30,
                    mem_total_bytes=141 * 2**30,
                    tree_mem_bytes=118 * 2**30,
                ),
            ),
            tree_mem_bytes=118 * 2**30,
        ),
        ladder=SAMPLE_LADDER,
        version="0.1.0",
    )
    return snap.model_copy(update=changes)


def sample_starting_snapshot() -> StatusSnapshot:
    return sample_snapshot(
        state="starting",
        phase="loading_weights",
        progress=ProgressView(done=45, total=61, unit="it", label="Loading safetensors", fraction=45 / 61),
        time_to_ready_s=None,
        serving=ServingView(),
    )


class FakeSupervisor:
    def __init__(self, snap: StatusSnapshot | None = None) -> None:
        self.snap = snap or sample_snapshot()
        self.submitted: list[Command] = []
        self.restarting = False
        self.diagnosing = False
        self.hold_capture = False
        self.capture_started = asyncio.Event()
        self.release_capture = asyncio.Event()
        self.fail_next: str | None = None  # the next command fails with this message

    def snapshot(self) -> StatusSnapshot:
        return self.snap

    async def submit(self, command: Command) -> CommandResult:
        self.submitted.append(command)
        if self.fail_next is not None:
            message, self.fail_next = self.fail_next, None
            return CommandResult("failed", message, state=self.snap.state)
        if command.kind == "restart":
            return self._restart(command)
        if command.kind == "diagnose":
            return await self._diagnose()
        if command.kind == "stop":
            if self.snap.state == "stopped":
                return CommandResult("done", "already stopped", state="stopped")  # as the daemon answers
            self.snap = self.snap.model_copy(update={"state": "stopped", "pid": None})
            return CommandResult("accepted", state="stopped")
        if command.kind == "start":
            if self.snap.state != "stopped":  # as the daemon answers (supervisor/policy/validation.py)
                st = self.snap.state
                if command.rung is not None:
                    return CommandResult("conflict", f"already running (state {st})", state=st)
                return CommandResult("done", f"already running (state {st})", state=st)
            self.snap = self.snap.model_copy(update={"state": "starting"})
            return CommandResult("accepted", state="starting")
        if command.kind == "reload":
            return CommandResult("done", "reloaded", state=self.snap.state)
        return CommandResult("invalid", f"{command.kind} is not supported here", state=self.snap.state)

    def _restart(self, command: Command) -> CommandResult:
        if self.restarting:
            return CommandResult("conflict", "a restart is already under way", state="restarting")
        if command.rung is not None and command.rung not in self.snap.ladder:
            return CommandResult("invalid", f"no rung named {command.rung!r}", state=self.snap.state)
        self.restarting = True
        self.snap = self.snap.model_copy(update={"state": "restarting"})
        return CommandResult("accepted", state="restarting", incident_id="inc-manual-1")

    async def _diagnose(self) -> CommandResult:
        if self.diagnosing:
            return CommandResult("busy", "a capture is under way", state="diagnosing")
        self.diagnosing = True
        try:
            if self.hold_capture:
                self.capture_started.set()
                await self.release_capture.wait()
            return CommandResult("done", bundle_id="b-manual", summary={"hang_class": "unknown"})
        finally:
            self.diagnosing = False


def attach(app: FastAPI, handle: SupervisorHandle) -> FastAPI:
    """Serve `app`'s routes over `handle`, the FastAPI way (`dependency_overrides`)."""
    app.dependency_overrides[get_supervisor] = lambda: handle
    return app
