"""The clean slate, acted: before every launch (after the stop of the last server, if any), remove
SGLang's stale shared memory, stop `sglang::` orphans of an earlier server of this state directory
and processes with this daemon's marker still holding GPU memory, and refuse the launch while a
stranger holds memory on the server's GPUs (SGLang would fail on it), naming pid and command.

A helper of the owner: it takes the values it needs and returns `Slate` (the `clean_slate` journal
fields and the refusal, if any); the owner records it and defers a refused launch.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from supervisor.daemon import cleanslate as cs
from supervisor.daemon.beating import keep_beating
from supervisor.daemon.stopping import StopTools
from supervisor.process.stoppids import stop_pids


def _sweep_shm(shm_dir: str) -> tuple[list[cs.StaleShm], list[str]]:
    if not shm_dir:
        return [], []
    d = Path(shm_dir)
    entries = cs.list_shm(d)
    in_use = cs.names_in_use(d) if any(cs.creator_pid(e.name) is None for e in entries) else set()
    return cs.remove_shm(d, cs.stale_shm(entries, cs.pid_alive, in_use, os.getuid()))


@dataclass(frozen=True)
class Slate:
    """`doc`: the `clean_slate` journal fields (empty: nothing found); `refused`: why the launch
    must wait (a stranger holds GPU memory), else None."""

    doc: dict[str, object]
    refused: str | None

    @property
    def warn(self) -> bool:
        return self.refused is not None or bool(self.doc.get("shm_errors"))


async def prepare(
    tools: StopTools,
    *,
    shm_dir: str,
    state_dir: Path,
    tree: set[int],
    env: Mapping[str, str],
    marker: str,
) -> Slate:
    """`tree`: the running server's pids (not orphans); `env`: what the server gets (its
    CUDA_VISIBLE_DEVICES names the GPUs to check)."""
    doc: dict[str, object] = {}
    removed, errors = await asyncio.to_thread(_sweep_shm, shm_dir)
    if removed or errors:
        doc["shm_removed"] = [f"{s.name} ({s.size} B, {s.why})" for s in removed]
        doc["shm_bytes_freed"] = sum(s.size for s in removed)
        doc["shm_errors"] = errors
    orphans = await asyncio.to_thread(cs.orphans, state_dir, tree, (1, os.getpid()))
    if orphans:
        report = await keep_beating(asyncio.to_thread(stop_pids, orphans, tools.grace_s), tools.beat)
        doc["orphans_found"] = orphans
        doc["orphans_stopped"] = list(report.pids_found)
        doc["orphans_survivors"] = list(report.survivors)
    refused = await _gpu_holders(tools, env, marker, doc)
    return Slate(doc, refused)


async def _gpu_holders(tools: StopTools, env: Mapping[str, str], marker: str, doc: dict[str, object]) -> str | None:
    gpu = await asyncio.to_thread(tools.gpu.snapshot_all)
    if gpu.status != "ok":
        return None
    gpus = cs.visible_gpus(env, gpu)
    holders = await asyncio.to_thread(cs.gpu_holders, gpu, (), gpus, cs.command_of)
    if not holders:
        return None
    ours = [h for h in holders if cs.carries(h[0], marker)]
    # A pid this daemon cannot see (another container's pid namespace, or an entry the driver kept
    # for a dead process) cannot be named or told from a stale one: recorded, not a refusal.
    unseen = [h for h in holders if h not in ours and not cs.pid_alive(h[0])]
    strangers = [h for h in holders if h not in ours and h not in unseen]
    if unseen:
        doc["gpu_unseen"] = [{"pid": p, "gpu": g, "bytes": b} for p, g, b, _ in unseen]
    if ours:
        pids = sorted({h[0] for h in ours})
        report = await keep_beating(asyncio.to_thread(stop_pids, pids, tools.grace_s), tools.beat)
        held = await asyncio.to_thread(tools.gpu.held_by, pids)
        doc["gpu_ours_stopped"] = list(report.pids_found)
        doc["gpu_ours_still_held"] = {str(k): v for k, v in held.items()}
    if not strangers:
        return None
    doc["gpu_strangers"] = [{"pid": p, "gpu": g, "bytes": b, "command": c} for p, g, b, c in strangers]
    named = "; ".join(f"pid {p} ({c}) holds {b / 2**30:.1f} GiB on GPU {g}" for p, g, b, c in strangers[:5])
    return f"GPU memory held by processes outside the server: {named}"
