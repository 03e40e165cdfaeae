"""The clean slate, acted: before every launch (after the stop of the last server, if any), remove
SGLang's stale shared memory, stop `sglang::` orphans of an earlier server of this state directory
and processes with this daemon's marker still holding GPU memory; then judge the processes outside
the server that hold memory on its GPUs (strangers) by need (supervisor/policy/gpufit.py): each is
named in the journal, and the launch waits (or, strictly, fails) only as `[slate] gpu_strangers`
says, with the numbers.

A helper of the owner: it takes the values it needs and returns `Slate` (the `clean_slate` journal
fields and the refusal, if any); the owner records it and defers a refused launch.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from supervisor.config.slate import SlateSettings
from supervisor.daemon import cleanslate as cs
from supervisor.daemon import shmledger
from supervisor.daemon.beating import keep_beating
from supervisor.daemon.stopping import StopTools
from supervisor.engines import SGLANG, EngineProfile
from supervisor.policy import gpufit
from supervisor.process.stoppids import stop_pids

_DEFAULT = SlateSettings()


def _sweep_shm(shm_dir: str, state_dir: Path) -> tuple[list[cs.StaleShm], list[str]]:
    if not shm_dir:
        return [], []
    return shmledger.sweep(Path(shm_dir), state_dir)  # only what this daemon's trees provably made


@dataclass(frozen=True)
class Slate:
    """`doc`: the `clean_slate` journal fields (empty: nothing found); `refused`: why the launch
    must not go ahead now (processes outside the server hold GPU memory, with the numbers), else
    None; `strict`: not a wait but a failure (`[slate] gpu_strangers = "refuse"`)."""

    doc: dict[str, object]
    refused: str | None
    strict: bool = False

    @property
    def warn(self) -> bool:
        return self.refused is not None or bool(self.doc.get("shm_errors")) or bool(self.doc.get("gpu_strangers"))


async def prepare(
    tools: StopTools,
    *,
    shm_dir: str,
    state_dir: Path,
    tree: set[int],
    env: Mapping[str, str],
    marker: str,
    argv: Sequence[str] = (),
    slate: SlateSettings = _DEFAULT,
    engine: EngineProfile = SGLANG,
) -> Slate:
    """`tree`: the running server's pids (not orphans); `env`: what the server gets (its
    CUDA_VISIBLE_DEVICES names the GPUs to check); `argv`: the command line about to be launched
    (its --mem-fraction-static, vLLM's --gpu-memory-utilization, is the need, supervisor/policy/gpufit.py)."""
    doc: dict[str, object] = {}
    removed, errors = await asyncio.to_thread(_sweep_shm, shm_dir, state_dir)
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
    need = gpufit.need_of(argv, slate.gpu_need_gib, engine)
    fit = await _gpu_holders(tools, env, marker, need, slate.gpu_strangers, doc)
    if fit is None or fit.action == "launch":
        return Slate(doc, None)
    return Slate(doc, fit.why, strict=fit.action == "refuse")


async def _gpu_holders(
    tools: StopTools,
    env: Mapping[str, str],
    marker: str,
    need: gpufit.Need,
    policy: gpufit.Policy,
    doc: dict[str, object],
) -> gpufit.FitDecision | None:
    gpu = await asyncio.to_thread(tools.gpu.snapshot_all)
    if gpu.status != "ok":
        return None
    gpus = cs.visible_gpus(env, gpu)
    holders = await asyncio.to_thread(cs.gpu_holders, gpu, (), gpus, cs.command_of)
    if not holders:
        return None
    ours = [h for h in holders if cs.carries(h[0], marker)]
    # A pid this daemon cannot see (another container's pid namespace, or an entry the driver kept
    # for a dead process) cannot be named or told from a stale one: recorded, not a refusal (its
    # memory still counts as used when the launch is judged by need).
    unseen = [h for h in holders if h not in ours and not cs.pid_alive(h[0])]
    strangers = [gpufit.Stranger(p, g, b, c) for p, g, b, c in holders if (p, g, b, c) not in ours + unseen]
    if unseen:
        doc["gpu_unseen"] = [{"pid": p, "gpu": g, "bytes": b} for p, g, b, _ in unseen]
    freed: set[int] = set()
    if ours:
        pids = sorted({h[0] for h in ours})
        report = await keep_beating(asyncio.to_thread(stop_pids, pids, tools.grace_s), tools.beat)
        held = await asyncio.to_thread(tools.gpu.held_by, pids)
        doc["gpu_ours_stopped"] = list(report.pids_found)
        doc["gpu_ours_still_held"] = {str(k): v for k, v in held.items()}
        freed = {p for p in pids if p not in held}
    if not strangers:
        return None
    rooms = [
        gpufit.GpuRoom(
            d.index,
            d.mem_total_bytes,
            d.mem_used_bytes,
            sum(b for p, g, b, _ in ours if g == d.index and p in freed),  # stopped, so free again
        )
        for d in gpu.devices
        if gpus is None or d.index in gpus
    ]
    decision = gpufit.decide(rooms, strangers, need, policy)
    doc["gpu_strangers"] = [
        {"pid": s.pid, "gpu": s.gpu, "bytes": s.used_bytes, "command": s.command} for s in strangers
    ]
    doc["gpu_fit"] = {
        "policy": policy,
        "action": decision.action,
        "need": need.describe(),
        "gpus": [
            {"gpu": g.index, "total_bytes": g.total_bytes, "free_bytes": g.free_bytes, "need_bytes": g.need_bytes}
            for g in decision.gpus
        ],
        "why": decision.why,
    }
    return decision
