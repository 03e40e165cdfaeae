"""The culprit first (issue 35), through the running daemon on the simulator: for each hang of
nvidia-resiliency-ext's fault catalogue that the simulator makes for real (LOCK_GIL, GPU_SLEEP,
SIGSTOP, SEGFAULT of a rank) and for the simulator's own deadlock and spin, the first line of
summary.txt names the culprit thread and its frame, summary.json has the typed `culprit`, and
/status carries the same line. A test here fails if the first line does not name them."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from serving import ready, traffic

pytestmark = pytest.mark.integration


def bundle_of(state_dir: str, bundle: str) -> tuple[str, dict[str, Any]]:
    d = Path(state_dir) / "diagnostics" / bundle
    return (d / "summary.txt").read_text(), json.loads((d / "summary.json").read_text())


async def hang_bundle(r: Any, timeout: float = 60) -> tuple[Any, str, dict[str, Any]]:
    snap = await r.wait_for(
        lambda x: x.last_incident is not None and x.last_incident.bundle is not None, timeout, "a hang's bundle"
    )
    inc = snap.last_incident
    text, doc = bundle_of(r.settings.paths.state_dir, inc.bundle)
    return inc, text, doc


def assert_first_line(text: str, doc: dict[str, Any], thread: str, frame: str, inc: Any) -> None:
    first = text.splitlines()[0]
    assert first.startswith("Culprit: scheduler TP0 pid "), text[:2000]
    assert f"thread '{thread}'" in first, first
    assert frame in first, first
    c = doc["culprit"]
    assert c["rank"] == 0 and c["thread"] == thread and c["text"] == first
    assert c["frames"] and frame in c["frames"][0], c
    assert isinstance(c["evidence"], list) and c["evidence"], c
    assert inc.culprit == first  # /status (last_incident) says the same line


@pytest.mark.parametrize(
    ("scenario", "thread", "frame", "doing"),
    [
        # LOCK_GIL: libc sleep through ctypes.PyDLL keeps the GIL; a helper thread cannot run.
        ("lock_gil_after_load", "MainThread", "ModelRunner.init_attention_backends", "holding the GIL"),
        # GPU_SLEEP: a kernel that never ends, the host spins in Event.synchronize.
        ("gpu_sleep_after_load", "MainThread", "Event.synchronize", "runs"),
        # The simulator's own: a lock-order deadlock (the main thread only joins) and a Python spin.
        ("deadlock_after_load", "weight-sync", "_sync_weights_to_graph_pool", "waits"),
        ("busy_hang_after_load", "custom-all-reduce", "_wait_for_peer_flag", "runs"),
    ],
)
async def test_the_first_line_names_the_culprit(daemon, sim, scenario, thread, frame, doing) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim(scenario, tp=1))
    inc, text, doc = await hang_bundle(r)
    assert inc.cause == "startup_stall", inc
    assert_first_line(text, doc, thread, frame, inc)
    assert doing in text.splitlines()[0]
    assert "idle helper thread" in text.splitlines()[1 + len(doc["culprit"]["evidence"]) + 1] or any(
        "idle helper thread" in line for line in text.splitlines()[:8]
    )


async def test_a_sigstopped_scheduler_is_the_culprit(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok", tp=1))
    snap = await r.wait_for(ready, 40, "ready")
    scheduler = next(p.pid for p in snap.processes if p.role == "scheduler")
    async with traffic(r.settings.server.port, concurrency=2):
        await r.wait_for(lambda x: (x.serving.running_reqs or 0) > 0, 20, "requests running")
        os.kill(scheduler, signal.SIGSTOP)
        inc, text, doc = await hang_bundle(r)
    first = text.splitlines()[0]
    assert first.startswith(f"Culprit: scheduler TP0 pid {scheduler} thread "), text[:1500]
    assert "is stopped (state T" in first, first
    assert doc["culprit"]["pid"] == scheduler and inc.culprit == first


async def test_a_rank_dead_of_segfault_leaves_the_waiting_rank_named(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    """SEGFAULT: TP1 dies inside its custom all-reduce; TP0 is left waiting for it."""
    r = await daemon(sim("rank_dies", tp=2))
    await r.wait_for(ready, 40, "ready")
    inc, text, doc = await hang_bundle(r)
    assert inc.cause == "rank_died", inc
    first = text.splitlines()[0]
    lost = int(re.search(r"\[(\d+)\]", inc.detail).group(1))  # type: ignore[union-attr]
    assert first.startswith("Culprit: "), text[:1500]
    # SGLang's main names the rank ("Subprocess scheduler_1 ... crashed") once it has logged it.
    assert f"TP1 pid {lost} (exited) thread '0x" in first or f"pid {lost} (exited) thread '0x" in first, first
    assert "died of a segmentation fault at all_reduce (sglang/srt/distributed/" in first, first
    assert doc["culprit"]["text"] == first and doc["culprit"]["pid"] == lost
    assert any(c["rank"] == 0 for c in doc["culprits"][1:])  # the rank left waiting is listed after
