"""The clean slate, acted: before every launch (after the stop of the last server, if any), remove
SGLang's stale shared memory, stop `sglang::` orphans of an earlier server of this state directory
and processes with this daemon's marker still holding GPU memory, and refuse the launch while a
stranger holds memory on the server's GPUs (SGLang would fail on it), naming pid and command.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import structlog

from supervisor.config.render import render_rung
from supervisor.daemon import cleanslate as cs
from supervisor.daemon.core import Core
from supervisor.daemon.guards import defer_launch
from supervisor.policy.ladder import backoff
from supervisor.process.stoppids import stop_pids

log = structlog.get_logger("supervisor")


def _sweep_shm(shm_dir: str) -> tuple[list[cs.StaleShm], list[str]]:
    if not shm_dir:
        return [], []
    d = Path(shm_dir)
    entries = cs.list_shm(d)
    in_use = cs.names_in_use(d) if any(cs.creator_pid(e.name) is None for e in entries) else set()
    return cs.remove_shm(d, cs.stale_shm(entries, cs.pid_alive, in_use, os.getuid()))


async def prepare(sup: Core, rung_index: int, *, after_incident: bool) -> bool:
    """True when the launch may go ahead; False: refused and retried later (as a held port is)."""
    rs = sup.settings.restart
    doc: dict[str, object] = {}
    removed, errors = await asyncio.to_thread(_sweep_shm, rs.shm_dir)
    if removed or errors:
        doc["shm_removed"] = [f"{s.name} ({s.size} B, {s.why})" for s in removed]
        doc["shm_bytes_freed"] = sum(s.size for s in removed)
        doc["shm_errors"] = errors
    tree = set(sup.obs.tree.pids) if sup.obs is not None and sup.server is not None else set()
    orphans = await asyncio.to_thread(cs.orphans, sup.state_dir, tree, (1, os.getpid()))
    if orphans:
        report = await sup.beating(asyncio.to_thread(stop_pids, orphans, rs.stop_grace_s))
        doc["orphans_found"] = orphans
        doc["orphans_stopped"] = list(report.pids_found)
        doc["orphans_survivors"] = list(report.survivors)
    refused = await _gpu_holders(sup, doc)
    if doc:
        sup.journal.append("clean_slate", **doc)
        (log.warning if refused or doc.get("shm_errors") else log.info)("clean_slate", **doc)
    if refused is None:
        sup.gpu_refusals = 0
        return True
    _refuse(sup, rung_index, after_incident, refused)
    return False


async def _gpu_holders(sup: Core, doc: dict[str, object]) -> str | None:
    gpu = await asyncio.to_thread(sup.observer.gpu.snapshot_all)
    if gpu.status != "ok":
        return None
    env = sup.child_env(render_rung(sup.settings.server, sup.settings.ladder[sup.ladder.current]).env)
    gpus = cs.visible_gpus(env, gpu)
    holders = await asyncio.to_thread(cs.gpu_holders, gpu, (), gpus, cs.command_of)
    if not holders:
        return None
    ours = [h for h in holders if cs.carries(h[0], sup.marker)]
    # A pid this daemon cannot see (another container's pid namespace, or an entry the driver kept
    # for a dead process) cannot be named or told from a stale one: recorded, not a refusal.
    unseen = [h for h in holders if h not in ours and not cs.pid_alive(h[0])]
    strangers = [h for h in holders if h not in ours and h not in unseen]
    if unseen:
        doc["gpu_unseen"] = [{"pid": p, "gpu": g, "bytes": b} for p, g, b, _ in unseen]
    if ours:
        pids = sorted({h[0] for h in ours})
        report = await sup.beating(asyncio.to_thread(stop_pids, pids, sup.settings.restart.stop_grace_s))
        held = await asyncio.to_thread(sup.observer.gpu.held_by, pids)
        doc["gpu_ours_stopped"] = list(report.pids_found)
        doc["gpu_ours_still_held"] = {str(k): v for k, v in held.items()}
    if not strangers:
        return None
    doc["gpu_strangers"] = [{"pid": p, "gpu": g, "bytes": b, "command": c} for p, g, b, c in strangers]
    named = "; ".join(f"pid {p} ({c}) holds {b / 2**30:.1f} GiB on GPU {g}" for p, g, b, c in strangers[:5])
    return f"GPU memory held by processes outside the server: {named}"


def _refuse(sup: Core, rung_index: int, after_incident: bool, why: str) -> None:
    sup.gpu_refusals += 1
    delay = backoff(sup.gpu_refusals, sup.settings.restart, sup.random())
    name = sup.settings.ladder[rung_index].name
    reason = f"{why}: not launching rung {name} (SGLang would fail on their memory); next try in {delay:.1f} s"
    defer_launch(sup, rung_index, after_incident, delay, reason, "gpu_held", gpu=why)
