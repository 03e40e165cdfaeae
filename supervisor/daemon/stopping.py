"""Stopping the server tree, then verifying that it let go: no member left, the port free, and NVML
showing none of its pids holding GPU memory (a bounded wait: GPU contexts take seconds to go).

Helpers of the owner: they take the tools they need (`StopTools`) and return what happened
(`Stopped`, `LeftoversStopped`); the owner empties its slot and records the event.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from probes.gpu import GpuProbe
from supervisor.clock import Clock, iso
from supervisor.daemon.beating import Beat, keep_beating
from supervisor.process.control import Child, ProcessControl, StopReport, describe_holders
from supervisor.status.snapshot import StopView

Release = Literal["released", "held", "unverified"]


@dataclass(frozen=True)
class StopTools:
    """What stopping a tree needs: the process control, NVML, the clock, the heartbeat, the limits."""

    control: ProcessControl
    gpu: GpuProbe
    clock: Clock
    beat: Beat
    host: str
    port: int
    grace_s: float
    release_timeout_s: float


@dataclass(frozen=True)
class Stopped:
    """A stop's outcome: `ok` when the port and GPU memory were verified free; `doc` is the
    `server_stopped` journal line."""

    ok: bool
    view: StopView
    doc: dict[str, object]


@dataclass(frozen=True)
class LeftoversStopped:
    """What a sweep of an earlier daemon's trees found; `doc` is the `leftovers_stopped` line."""

    ok: bool
    pids: tuple[int, ...]
    doc: dict[str, object]


async def stop_tree(tools: StopTools, child: Child | None, marker: str, seen: tuple[int, ...], why: str) -> Stopped:
    """Stop the tree (`seen`: its pids at the last poll), then verify the port and GPU memory are free."""
    report: StopReport = await keep_beating(
        asyncio.to_thread(tools.control.stop, child, marker, tools.host, tools.port, tools.grace_s), tools.beat
    )
    pids = seen
    if child is not None:
        pids = tuple({*pids, child.pid, *report.pids_found})
    released, held, waited = await verify_release(tools, pids)
    ok = report.ok and released != "held"
    view = StopView(
        at=iso(tools.clock.wall()) or "",
        survivors=len(report.survivors),
        port_free=report.port_free,
        gpu_released=released,
    )
    doc: dict[str, object] = {
        "why": why,
        "pids_found": list(report.pids_found),
        "killed": list(report.killed),
        "survivors": list(report.survivors),
        "port_free": report.port_free,
        "exit_code": report.exit_code,
        "stop_s": round(report.duration_s, 3),
        "gpu_released": gpu_verdict(released),
        "gpu_check": "unavailable" if released == "unverified" else "nvml",
        "port_holders": list(report.port_holders),
        "port_held_by": None if report.port_free else describe_holders(report.port_holders),
        "gpu_held_bytes": held,
        "release_wait_s": round(waited, 3),
    }
    return Stopped(ok, view, doc)


async def stop_leftovers(tools: StopTools, markers: tuple[str, ...], why: str) -> LeftoversStopped:
    """Stop what an earlier daemon left running (`supervisor.process.leftovers.kill_leftovers`,
    through the control), verified like any stop. `why` says why it is not adopted: a server that
    was serving is reloaded by this, and the journal must say why (`leftovers_stopped.reason`)."""
    report = await keep_beating(
        asyncio.to_thread(tools.control.kill_leftovers, markers, tools.host, tools.port), tools.beat
    )
    if not report.pids_found:
        return LeftoversStopped(True, (), {})
    released, held, waited = await verify_release(tools, report.pids_found)
    doc: dict[str, object] = {
        "reason": why or "a tree with this state directory's marker was running and is not adopted",
        "pids_found": list(report.pids_found),
        "killed": list(report.killed),
        "survivors": list(report.survivors),
        "port_free": report.port_free,
        "port_holders": list(report.port_holders),
        "stop_s": round(report.duration_s, 3),
        "gpu_released": gpu_verdict(released),
        "gpu_held_bytes": held,
        "release_wait_s": round(waited, 3),
    }
    return LeftoversStopped(report.ok and released != "held", report.pids_found, doc)


async def verify_release(tools: StopTools, pids: tuple[int, ...]) -> tuple[Release, int, float]:
    """Bounded wait until NVML shows none of the old tree's pids holding GPU memory.

    "unverified" when NVML cannot answer: nothing is known, which is not "released".
    """
    clock = tools.clock
    start = clock.monotonic()
    if not pids:
        return "released", 0, 0.0
    deadline = start + tools.release_timeout_s
    while True:
        # every GPU, not only the server's scope: a process of the tree holds memory wherever it is
        gpu = await asyncio.to_thread(functools.partial(tools.gpu.observe, pids, scoped=False))
        if gpu.status != "ok":
            return "unverified", 0, clock.monotonic() - start
        held = {p.pid for p in gpu.processes if p.pid in pids}
        total = sum(p.used_bytes for p in gpu.processes if p.pid in pids)
        if not held:  # a pid listed with unknown memory (0 bytes) still holds a context
            return "released", 0, clock.monotonic() - start
        if clock.monotonic() >= deadline:
            return "held", total, clock.monotonic() - start
        tools.beat()
        await clock.sleep(0.1)


def gpu_verdict(release: Release) -> bool | str:
    """The journal's `gpu_released`: true only when NVML verified it, "unverified" when it could not."""
    return {"released": True, "held": False}.get(release, "unverified")


async def sweep(tools: StopTools, markers: tuple[str, ...], record: Callable[..., None], why: str) -> tuple[int, ...]:
    """What an earlier daemon left running and is not adopted: stopped (one sweep), verified, and
    journalled with why (`leftovers_stopped`; an older version saved another marker, so both go)."""
    swept = await stop_leftovers(tools, markers, why)
    if swept.pids:
        record("leftovers_stopped", "warning" if swept.ok else "error", **swept.doc)
    return swept.pids
