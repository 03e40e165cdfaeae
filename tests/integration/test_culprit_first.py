"""The culprit first (issue 35), through the running daemon on the simulator: for EVERY hang class
the simulator makes for real, the first line of summary.txt names the culprit thread and its frame,
summary.json has the typed `culprit` (and `culprits`), and /status (`last_incident.culprit`) carries
the same line. A test here fails if the first line does not name them.

Two daemons, each running several scenarios down its ladder (one rung per scenario, no retries): at
start-up the simulator's lock-order deadlock (idle_deadlock), its Python spin (busy_spin), the draft
graph's never-ending capture kernel (cuda_graph_capture), nvidia-resiliency-ext's LOCK_GIL (native
sleep holding the GIL) and GPU_SLEEP (a kernel that never ends), and a scheduler stuck in D state
(io_wait); while serving at tp 2 a SIGSTOPped scheduler (SIGSTOP), a decode stall (serving_stall,
its ranks waiting in a collective) and a rank dead of a segfault (SEGFAULT -> rank_died)."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from notifyhook import hook, hook_calls, with_notify
from serving import SPEC, ready, traffic

from supervisor.client.format import format_answer
from supervisor.config.alerting import NotifyTarget
from supervisor.config.settings import BASE_RUNG

pytestmark = pytest.mark.integration


def bundle_of(state_dir: str, bundle: str) -> tuple[str, dict[str, Any]]:
    d = Path(state_dir) / "diagnostics" / bundle
    return (d / "summary.txt").read_text(), json.loads((d / "summary.json").read_text())


def rung(name: str, scenario: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "env": {"SGLANG_SIM_SCENARIO": scenario}, **more}


class Seen:
    """Every incident the daemon's /status showed, by rung, once its bundle was written."""

    def __init__(self) -> None:
        self.by_rung: dict[str, Any] = {}

    def note(self, snap: Any) -> None:
        inc = snap.last_incident
        if inc is not None and inc.bundle is not None and inc.culprit is not None:
            self.by_rung.setdefault(inc.rung, inc)

    def until(self, rungs: set[str]) -> Callable[[Any], bool]:
        def done(snap: Any) -> bool:
            self.note(snap)
            return rungs <= set(self.by_rung)

        return done


def check_first_line(r: Any, inc: Any, thread: str, frame: str, doing: str) -> tuple[str, dict[str, Any]]:
    text, doc = bundle_of(r.settings.paths.state_dir, inc.bundle)
    lines = text.splitlines()
    first = lines[0]
    assert first.startswith("Culprit: scheduler TP"), text[:2000]
    assert f"thread '{thread}'" in first, (inc.rung, first)
    assert frame in first, (inc.rung, first)
    assert doing in first, (inc.rung, first)
    c = doc["culprit"]
    assert c["thread"] == thread and c["text"] == first, c
    assert c["frames"] and frame in c["frames"][0], c
    assert isinstance(c["pid"], int) and isinstance(c["evidence"], list) and c["evidence"], c
    assert doc["culprits"][0] == c
    assert inc.culprit == first  # /status (last_incident) says the same line
    # The evidence follows as "because ..." lines, then the idle helpers folded into a count.
    assert lines[1].startswith("  because "), lines[:4]
    assert any(re.match(r"  \d+ idle helper threads? folded", line) for line in lines[1:10]), lines[:10]
    return text, doc


QUICK = {
    "retries_per_rung": 0,
    "backoff_initial_s": 0.1,
    "backoff_max_s": 0.2,
    "backoff_jitter": 0.0,
    "max_restarts_per_hour": 50,
}
START = [  # (rung, scenario, extra rung keys, hang class, culprit thread, frame, what it does)
    ("deadlock", "deadlock_after_load", {}, "idle_deadlock", "weight-sync", "_sync_weights_to_graph_pool", "waits"),
    ("spin", "busy_hang_after_load", {}, "busy_spin", "custom-all-reduce", "_wait_for_peer_flag", "runs"),
    (
        "capture",
        "busy_capture_hang",
        {"args": SPEC},
        "cuda_graph_capture",
        "MainThread",
        "Event.synchronize",
        "runs",
    ),
    (
        "lock-gil",
        "lock_gil_after_load",
        {},
        "idle_deadlock",
        "MainThread",
        "ModelRunner.init_attention_backends",
        "holding the GIL",
    ),
    ("gpu-sleep", "gpu_sleep_after_load", {}, None, "MainThread", "Event.synchronize", "runs"),
    ("io-wait", "io_wait_after_load", {}, "io_wait", "MainThread", "stuck_in_kernel", "is in D state"),
]


@pytest.mark.timeout(300)
async def test_every_start_up_hang_names_its_culprit_first(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    first, *rest = START
    s = sim(
        first[1],
        tp=1,
        env={"TORCH_FR_BUFFER_SIZE": "64"},  # the operator's own Flight Recorder buffer: kept
        fallback=[rung(name, scenario, **more) for name, scenario, more, *_ in rest] + [rung("ok", "ok")],
        restart=QUICK,
    )
    r = await daemon(s)
    seen = Seen()
    await r.wait_for(seen.until({BASE_RUNG, *(row[0] for row in rest)}), 240, "every start-up hang's bundle")
    by_rung = {**seen.by_rung, first[0]: seen.by_rung[BASE_RUNG]}
    for name, _, _, hang_class, thread, frame, doing in START:
        inc = by_rung[name]
        assert inc.cause == "startup_stall", inc
        if hang_class is not None:
            assert inc.hang_class == hang_class, inc
        check_first_line(r, inc, thread, frame, doing)
    # The Flight Recorder: launched with its pipe, dump file and dump-on-timeout beside the
    # operator's buffer (not overridden), and a tree with no torch.distributed group says so plainly.
    bundle = Path(r.settings.paths.state_dir) / "diagnostics" / by_rung["deadlock"].bundle
    env = json.loads((bundle / "env.json").read_text())
    assert env["TORCH_FR_BUFFER_SIZE"] == "64" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"].endswith("/flightrec/pipe_rank_")
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    fr = json.loads((bundle / "summary.json").read_text())["flight_recorder"]
    assert fr["status"] == "nothing" and fr["wait_s"] == 0.0, fr
    assert "NCCL Flight Recorder: nothing" in (bundle / "summary.txt").read_text()


@pytest.mark.timeout(240)
async def test_every_serving_hang_names_its_culprit_first(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Also where a person meets the line: `status` (the CLI's rendering of /status), the page's
    incidents and an incident notification (an exec hook's summary text and environment)."""
    out, argv = hook(tmp_path)
    s = sim(
        "ok",
        tp=2,
        fallback=[rung("stall", "serving_stall"), rung("segfault", "rank_dies"), rung("ok", "ok")],
        restart=QUICK,
    )
    r = await daemon(with_notify(s, NotifyTarget(name="hook", kind="exec", argv=argv)))
    seen = Seen()
    snap = await r.wait_for(ready, 40, "ready")
    base = snap.rung
    assert base == BASE_RUNG
    tp0 = next(p.pid for p in snap.processes if p.role == "scheduler" and p.rank == 0)
    async with traffic(r.settings.server.port, concurrency=2):
        await r.wait_for(lambda x: (x.serving.running_reqs or 0) > 0, 20, "requests running")
        os.kill(tp0, signal.SIGSTOP)  # SIGSTOP: the rank runs nothing, its peer waits for it
        await r.wait_for(seen.until({base}), 60, "the SIGSTOP's bundle")
        await r.wait_for(lambda x: x.rung == "stall" and x.state == "ready", 60, "the stall rung serves")
        await r.wait_for(seen.until({base, "stall"}), 60, "the serving stall's bundle")
    await r.wait_for(seen.until({base, "stall", "segfault"}), 90, "the segfault's bundle")

    stopped = seen.by_rung[base]
    text, doc = bundle_of(r.settings.paths.state_dir, stopped.bundle)
    first = text.splitlines()[0]
    assert first.startswith(f"Culprit: scheduler TP0 pid {tp0} thread "), text[:1500]
    assert "is stopped (state T" in first and " at " in first, first  # the frame it stopped in
    assert doc["culprit"]["pid"] == tp0 and stopped.culprit == first
    assert [c["rank"] for c in doc["culprits"]] == [0, 1], doc["culprits"]

    stall = seen.by_rung["stall"]
    assert stall.cause == "serving_stall", stall
    # The simulator's stall keeps the scheduler's loop polling for work it never decodes.
    check_first_line(r, stall, "MainThread", "ServingLoop._receive", "waits in select")

    dead = seen.by_rung["segfault"]
    assert dead.cause == "rank_died", dead
    text, doc = bundle_of(r.settings.paths.state_dir, dead.bundle)
    first = text.splitlines()[0]
    lost = int(re.search(r"\[(\d+)\]", dead.detail).group(1))  # type: ignore[union-attr]
    assert first.startswith("Culprit: "), text[:1500]
    assert f"pid {lost} (exited) thread '0x" in first, first
    assert "died of a segmentation fault at all_reduce (sglang/srt/distributed/" in first, first
    assert doc["culprit"]["text"] == first and doc["culprit"]["pid"] == lost and dead.culprit == first
    assert any(c["rank"] == 0 for c in doc["culprits"][1:])  # the rank left waiting is listed after

    # Where a person reads it: the CLI's status, the page, the incident notification.
    async with httpx.AsyncClient(timeout=10) as c:
        status = (await c.get(f"{r.api}/status")).json()
        page = (await c.get(f"{r.api}/ui")).text
    assert status["last_incident"]["culprit"] == dead.culprit
    assert dead.culprit in format_answer("status", status), format_answer("status", status)
    assert html.escape(stall.culprit, quote=True)[:200] in page, "the page's incidents show the culprit line"
    calls = await wait_hook(out, lambda cs: sum(1 for x in cs if x["env"].get("SGLANG_SUPERVISOR_CULPRIT")) >= 3)
    told = {x["env"]["SGLANG_SUPERVISOR_CULPRIT"] for x in calls if x["env"].get("SGLANG_SUPERVISOR_CULPRIT")}
    assert {stopped.culprit, stall.culprit, dead.culprit} <= told, told
    summary = next(x["stdin"]["summary"] for x in calls if x["env"].get("SGLANG_SUPERVISOR_CULPRIT") == dead.culprit)
    assert f"; {dead.culprit} (evidence {dead.bundle})" in summary, summary


async def wait_hook(out: Path, enough: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    for _ in range(300):
        calls = hook_calls(out)
        if enough(calls):
            return calls
        await asyncio.sleep(0.1)
    return hook_calls(out)
