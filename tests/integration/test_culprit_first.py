"""The culprit first (issue 35), through the running daemon on the simulator: for EVERY hang class
the simulator makes for real, the first line of summary.txt names the culprit thread and its frame,
summary.json has the typed `culprit` (and `culprits`), and /status (`last_incident.culprit`) carries
the same line. A test here fails if the first line does not name them, or if a scenario's hang
class is not the one asserted for it.

Two daemons, each running several scenarios down its ladder (one rung per scenario, no retries): at
tp 1 the simulator's lock-order deadlock (idle_deadlock), its Python spin (busy_spin), the draft
graph's never-ending capture kernel (cuda_graph_capture), nvidia-resiliency-ext's LOCK_GIL (native
sleep holding the GIL: idle_deadlock) and GPU_SLEEP (a kernel that never ends: busy_spin), a
scheduler stuck in D state (io_wait), and after ready `health_hangs` (the scheduler blocked for good:
unhealthy, idle_deadlock); while serving at tp 2 a SIGSTOPped rank that NCCL's RAS (a fake ncclras)
reports missing from the communicator (collective), a decode stall whose scheduler keeps polling for
work (serving_stall, unknown) and a rank dead of a segfault (SEGFAULT -> rank_died).

Every class of supervisor.status.causes.HangClass is asserted here. `collective` needs NCCL's word:
on one node the simulator's ranks talk over pipes, so no rank waits in a torch.distributed frame
(only a multi-node group's followers wait in `broadcast`); tests/diagnostics/test_diag_culprit.py
has the frames' own collective rule in its per-class table."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_ras import FakeRas, comm, report
from notifyhook import hook, hook_calls, with_notify
from serving import SPEC, ready, traffic
from simconfig import QUICK_RESTART

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


START = [  # (rung, scenario, extra rung keys, cause, hang class, culprit thread, frame, what it does)
    (
        "deadlock",
        "deadlock_after_load",
        {},
        "startup_stall",
        "idle_deadlock",
        "weight-sync",
        "_sync_weights_to_graph_pool",
        "waits",
    ),
    (
        "spin",
        "busy_hang_after_load",
        {},
        "startup_stall",
        "busy_spin",
        "custom-all-reduce",
        "_wait_for_peer_flag",
        "runs",
    ),
    (
        "capture",
        "busy_capture_hang",
        {"args": SPEC},
        "startup_stall",
        "cuda_graph_capture",
        "MainThread",
        "Event.synchronize",
        "runs",
    ),
    (
        "lock-gil",
        "lock_gil_after_load",
        {},
        "startup_stall",
        "idle_deadlock",
        "MainThread",
        "ModelRunner.init_attention_backends",
        "holding the GIL",
    ),
    ("gpu-sleep", "gpu_sleep_after_load", {}, "startup_stall", "busy_spin", "MainThread", "Event.synchronize", "runs"),
    ("io-wait", "io_wait_after_load", {}, "startup_stall", "io_wait", "MainThread", "stuck_in_kernel", "is in D state"),
    # After ready: the scheduler's loop blocks for good on a lock; /health stops answering.
    ("health", "health_hangs", {}, "unhealthy", "idle_deadlock", "MainThread", "wait_for_collective", "waits"),
]


@pytest.mark.timeout(330)
async def test_every_start_up_hang_names_its_culprit_first(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    """The start-up hangs, then a hung health check: one tp 1 daemon down a ladder of scenarios."""
    first, *rest = START
    s = sim(
        first[1],
        tp=1,
        env={"TORCH_FR_BUFFER_SIZE": "64"},  # the operator's own Flight Recorder buffer: kept
        fallback=[rung(name, scenario, **more) for name, scenario, more, *_ in rest] + [rung("ok", "ok")],
        restart=QUICK_RESTART,
        # A health probe's request in flight when the scheduler blocks freezes `num_running_reqs` at 1:
        # the serving-stall window stays out of the health channel's way (no traffic here otherwise).
        watchdog={"serving_stall_s": 30.0},
    )
    r = await daemon(s)
    seen = Seen()
    await r.wait_for(seen.until({BASE_RUNG, *(row[0] for row in rest)}), 270, "every start-up hang's bundle")
    by_rung = {**seen.by_rung, first[0]: seen.by_rung[BASE_RUNG]}
    for name, _, _, cause, hang_class, thread, frame, doing in START:
        inc = by_rung[name]
        assert (inc.cause, inc.hang_class) == (cause, hang_class), (name, inc)
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


@pytest.fixture
def nccl_ras() -> Iterator[tuple[FakeRas, list[str]]]:
    """A fake `ncclras` listener and the report it gives: the last one appended, else no communicator."""
    reports: list[str] = []
    ras = FakeRas(lambda: reports[-1] if reports else report([]))
    try:
        yield ras, reports
    finally:
        ras.close()


@pytest.mark.timeout(240)
async def test_every_serving_hang_names_its_culprit_first(daemon, sim, tmp_path: Path, nccl_ras) -> None:  # type: ignore[no-untyped-def]
    """Also where a person meets the line: `status` (the CLI's rendering of /status), the page's
    incidents and an incident notification (an exec hook's summary text and environment)."""
    ras, reports = nccl_ras
    out, argv = hook(tmp_path)
    s = sim(
        "ok",
        tp=2,
        env={"NCCL_RAS_ADDR": ras.address},
        # Each rung answers the fault of the rung above (`on`), so the served ladder steps down to the next
        # fault's rung (issue 49: a fault after serving that no rung answers is relaunched on its rung).
        fallback=[
            rung("stall", "serving_stall", on=["unhealthy"]),
            rung("segfault", "rank_dies", on=["serving_stall"]),
            rung("ok", "ok", on=["rank_died"]),
        ],
        restart=QUICK_RESTART,
    )
    r = await daemon(with_notify(s, NotifyTarget(name="hook", kind="exec", argv=argv)))
    seen = Seen()
    snap = await r.wait_for(ready, 40, "ready")
    base = snap.rung
    assert base == BASE_RUNG
    tp0, tp1 = (next(p.pid for p in snap.processes if p.role == "scheduler" and p.rank == k) for k in (0, 1))
    async with traffic(r.settings.server.port, concurrency=2):
        await r.wait_for(lambda x: (x.serving.running_reqs or 0) > 0, 20, "requests running")
        os.kill(tp1, signal.SIGSTOP)  # SIGSTOP: the rank runs nothing, its peer waits for it
        # NCCL's view: TP0 is in the communicator with 9 all-reduces, TP1 (stopped) no longer answers.
        reports.append(report([comm([tp0], missing=[(1, tp1)], counts=[9])]))
        await r.wait_for(seen.until({base}), 60, "the SIGSTOP's bundle")
        reports.clear()
        await r.wait_for(lambda x: x.rung == "stall" and x.state == "ready", 60, "the stall rung serves")
        await r.wait_for(seen.until({base, "stall"}), 60, "the serving stall's bundle")
    await r.wait_for(seen.until({base, "stall", "segfault"}), 90, "the segfault's bundle")

    # The stopped rank comes first, though it is not the lowest, as the rank that never joined.
    stopped = seen.by_rung[base]
    assert stopped.hang_class == "collective", stopped
    text, doc = bundle_of(r.settings.paths.state_dir, stopped.bundle)
    first = text.splitlines()[0]
    assert first.startswith(f"Culprit: scheduler TP1 pid {tp1} thread "), text[:1500]
    assert "is stopped (state T" in first and " at " in first, first  # the frame it stopped in
    assert doc["culprit"]["pid"] == tp1 and stopped.culprit == first
    assert doc["culprit"]["evidence"][0] == "this rank never joined the collective the other ranks wait in"
    assert [c["rank"] for c in doc["culprits"]] == [1, 0], doc["culprits"]
    assert doc["collective"]["source"] == "ras" and doc["collective"]["missing_ranks"] == [1], doc["collective"]

    stall = seen.by_rung["stall"]
    # The simulator's stall keeps the scheduler's loop polling for work it never decodes: no rule
    # matches a thread that waits for input, so the class is `unknown`, and the culprit still named.
    assert (stall.cause, stall.hang_class) == ("serving_stall", "unknown"), stall
    text, doc = check_first_line(r, stall, "MainThread", "ServingLoop._receive", "waits in select")
    # held_s is the verdict's seconds without a decode token (`since_tokens_s`), at least the window.
    assert doc["culprit"]["held_s"] >= 4.0 and text.splitlines()[0].endswith(" s"), doc["culprit"]

    dead = seen.by_rung["segfault"]
    assert dead.cause == "rank_died", dead
    # TP0 idles in its loop (`unknown`), unless a health probe's forward met the dead peer first and
    # left it blocked on a lock for good (`idle_deadlock`): the race is the probe's, not the culprit's.
    assert dead.hang_class in ("unknown", "idle_deadlock"), dead
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
