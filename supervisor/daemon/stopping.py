"""Stopping the server tree, then verifying that it let go: no member left, the port free, and NVML
showing none of its pids holding GPU memory (a bounded wait: GPU contexts take seconds to go)."""

from __future__ import annotations

import asyncio
import functools
from typing import Literal

import structlog

from supervisor.daemon.core import Core
from supervisor.daemon.publish import iso
from supervisor.daemon.snapshot import StopView
from supervisor.process.control import StopReport, describe_holders

log = structlog.get_logger("supervisor")


async def stop_server(sup: Core, why: str) -> bool:
    """Stop the tree, then verify the port and GPU memory are free. True when verified."""
    server = sup.server
    pids = sup.obs.tree.pids if sup.obs is not None else ()
    rs = sup.settings.restart
    srv = sup.settings.server
    report: StopReport = await sup.beating(
        asyncio.to_thread(sup.control.stop, server, sup.marker, srv.host, srv.port, rs.stop_grace_s)
    )
    if server is not None:
        pids = tuple({*pids, server.pid, *report.pids_found})
    released, held, waited = await verify_release(sup, pids)
    if sup.capture is not None:
        cap = sup.capture
        await asyncio.to_thread(cap.close)
        sup.server_log_write_errors()  # its last count, before the next keeper starts its file afresh
        sup.capture = None
    sup.server = None
    sup.server_record = None
    sup.history = None
    ok = report.ok and released != "held"
    sup.last_stop = StopView(
        at=iso(sup.clock.wall()) or "",
        survivors=len(report.survivors),
        port_free=report.port_free,
        gpu_released=released,
    )
    doc = {
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
    sup.journal.append("server_stopped", **doc)
    (log.info if ok else log.error)("server_stopped", **doc)
    return ok


Release = Literal["released", "held", "unverified"]


async def verify_release(sup: Core, pids: tuple[int, ...]) -> tuple[Release, int, float]:
    """Bounded wait until NVML shows none of the old tree's pids holding GPU memory.

    "unverified" when NVML cannot answer: nothing is known, which is not "released".
    """
    start = sup.clock.monotonic()
    if not pids:
        return "released", 0, 0.0
    deadline = start + sup.settings.restart.release_timeout_s
    while True:
        # every GPU, not only the server's scope: a process of the tree holds memory wherever it is
        gpu = await asyncio.to_thread(functools.partial(sup.observer.gpu.observe, pids, scoped=False))
        if gpu.status != "ok":
            return "unverified", 0, sup.clock.monotonic() - start
        held = {p.pid for p in gpu.processes if p.pid in pids}
        total = sum(p.used_bytes for p in gpu.processes if p.pid in pids)
        if not held:  # a pid listed with unknown memory (0 bytes) still holds a context
            return "released", 0, sup.clock.monotonic() - start
        if sup.clock.monotonic() >= deadline:
            return "held", total, sup.clock.monotonic() - start
        sup.beat()
        await sup.clock.sleep(0.1)


def gpu_verdict(release: Release) -> bool | str:
    """The journal's `gpu_released`: true only when NVML verified it, "unverified" when it could not."""
    return {"released": True, "held": False}.get(release, "unverified")
