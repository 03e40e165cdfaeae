"""The fault matrix for both engines (issue 37): the same faults, injected into the simulator speaking
SGLang and speaking vLLM (`--engine vllm`: its lines, titles, metrics, flag-only /health and port
semantics), each judged by the running daemon through the engine's profile. And one ladder that
crosses engines: SGLang deadlocks, the daemon steps down to a vLLM rung, which serves."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import SPEC, VLLM_SPEC, ready, traffic
from simconfig import vllm_rung

pytestmark = pytest.mark.integration

ENGINES = ("sglang", "vllm")


def events(s: Any) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (Path(s.paths.state_dir) / "events.jsonl").read_text().splitlines()]


def incident(snap: Any) -> Any:
    assert snap.last_incident is not None
    return snap.last_incident


@pytest.mark.parametrize("engine", ENGINES)
async def test_serves_and_names_its_engine_and_ranks(daemon, sim, engine: str) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", engine=engine)
    r = await daemon(s)
    snap = await r.wait_for(lambda x: ready(x) and len([p for p in x.processes if p.role == "scheduler"]) == 2, 30,
                            "ready with both ranks named")  # fmt: skip
    assert snap.engine == engine and snap.ladder_engines == (engine,)
    assert sorted(p.rank for p in snap.processes if p.role == "scheduler") == [0, 1]
    launched = next(e for e in events(s) if e["event"] == "server_launched")
    assert launched["engine"] == engine


@pytest.mark.parametrize("engine", ENGINES)
async def test_deadlock_after_load_is_a_startup_stall(daemon, sim, engine: str) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("deadlock_after_load", engine=engine))
    snap = await r.wait_for(lambda x: x.last_incident is not None and x.last_incident.bundle is not None, 40,
                            "the stall judged and its evidence kept")  # fmt: skip
    inc = incident(snap)
    assert inc.cause == "startup_stall" and inc.hang_class == "idle_deadlock" and inc.rung == "base"


async def test_vllms_waiting_lines_during_a_hang_are_not_progress(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    """At tp > 1 a hung vLLM engine repeats "No available shared memory broadcast block found in N
    seconds" (shm_broadcast.py:96) every VLLM_RINGBUFFER_WARNING_INTERVAL: output while it waits on a
    rank that never answers. Counted as log progress, it would postpone the verdict for good."""
    s = sim("busy_capture_hang", engine="vllm", tp=2, env={"VLLM_RINGBUFFER_WARNING_INTERVAL": "1"})
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.last_incident is not None, 60, "the stall judged despite the waiting lines")
    assert incident(snap).cause == "startup_stall" and incident(snap).rung == "base"
    log = (Path(s.paths.state_dir) / "logs" / "server.log").read_text()
    assert log.count("No available shared memory broadcast block found") >= 3  # the window saw several


@pytest.mark.parametrize("engine", ENGINES)
async def test_busy_hang_after_load_is_busy(daemon, sim, engine: str) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("busy_hang_after_load", engine=engine))
    snap = await r.wait_for(lambda x: x.last_incident is not None, 40, "the busy stall")
    assert incident(snap).cause == "startup_stall" and incident(snap).hang_class == "busy_spin"


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_slow_load_is_never_judged_stalled(daemon, sim, engine: str) -> None:  # type: ignore[no-untyped-def]
    """One shard every 6 s, three stall windows per shard: the bar and the reads are progress, for
    vLLM's `Loading safetensors checkpoint shards` as for SGLang's."""
    s = sim("slow_load", engine=engine, env={"SGLANG_SIM_SHARD_S": "6"},
            watchdog={"startup_stall_s": 2.0, "cpu_only_stall_s": 4.0})  # fmt: skip
    r = await daemon(s)
    await r.wait_for(lambda x: x.phase == "loading_weights" and x.progress is not None, 30, "loading shards")
    for _ in range(100):  # five stall windows
        snap = r.snap()
        assert snap.last_incident is None and snap.state == "starting", (snap.reason, snap.last_incident)
        await asyncio.sleep(0.1)
    assert snap.progress is not None and snap.progress.unit == "shards"


@pytest.mark.parametrize("engine", ENGINES)
async def test_crash_after_ready_is_exited(daemon, sim, engine: str) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("crash_after_ready", engine=engine, restart={"retries_per_rung": 3}))
    await r.wait_for(ready, 30, "ready")
    snap = await r.wait_for(lambda x: x.last_incident is not None, 30, "the crash")
    # SGLang 0.5.16's main lives on through its crash diagnostics, so a poll may see the dead rank first.
    assert incident(snap).cause in ("rank_died", "exited")
    await r.wait_for(lambda x: ready(x) and x.restarts >= 1, 40, "ready again after the restart")


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_dead_rank_is_caught(daemon, sim, engine: str) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("rank_dies", engine=engine, tp=2))
    await r.wait_for(ready, 30, "ready")
    snap = await r.wait_for(lambda x: x.last_incident is not None, 30, "the dead rank")
    # SGLang keeps its front up over a dead scheduler; vLLM's executor sees its worker die and shuts
    # the engine down, so the whole server may be gone by the next poll.
    assert incident(snap).cause in (("rank_died",) if engine == "sglang" else ("rank_died", "exited"))


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_hung_engine_is_unhealthy_even_where_health_is_a_flag(daemon, sim, engine: str) -> None:  # type: ignore[no-untyped-def]
    """SGLang's /health generates, so it fails over a hung scheduler; vLLM's /health stays 200 over a
    hung engine (vllm#46811), and the daemon's canary generation is what fails."""
    r = await daemon(sim("health_hangs", engine=engine, watchdog={"serving_stall_s": 30.0}))
    await r.wait_for(ready, 30, "ready")
    # An idle vLLM gets its canary at most once a serving window (issue 51): the first after the hang
    # may come a window (30 s here) after the last that passed, then one at every check until unhealthy.
    snap = await r.wait_for(lambda x: x.last_incident is not None, 80, "unhealthy")
    inc = incident(snap)
    assert inc.cause == "unhealthy"
    if engine == "vllm":
        assert "canary generation" in inc.detail


@pytest.mark.parametrize("engine", ENGINES)
async def test_serving_stall_under_traffic(daemon, sim, engine: str) -> None:  # type: ignore[no-untyped-def]
    s = sim("serving_stall", engine=engine)
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    async with traffic(s.server.port, concurrency=3, engine=engine):
        snap = await r.wait_for(lambda x: x.last_incident is not None, 40, "serving stall")
    assert incident(snap).cause == "serving_stall"
    # vLLM prints no ready line: the server the daemon judged ready was serving all the same (real
    # vLLM's stall bundles once said `warming_up`, the last start-up phase its log showed).
    bundle = Path(s.paths.state_dir) / "diagnostics" / str(incident(snap).bundle)
    assert json.loads((bundle / "summary.json").read_text())["phase"] == "serving"


@pytest.mark.parametrize("engine", ENGINES)
async def test_low_acceptance_is_a_spec_regression(daemon, sim, engine: str) -> None:  # type: ignore[no-untyped-def]
    s = sim("low_accept", engine=engine, args=VLLM_SPEC if engine == "vllm" else SPEC,
            watchdog={"on_spec_regression": "alert"})  # fmt: skip
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    async with traffic(s.server.port, concurrency=3, engine=engine):
        snap = await r.wait_for(lambda x: x.state == "degraded", 40, "degraded by low acceptance")
    assert snap.serving.spec_accept_length is not None and snap.serving.spec_accept_length < 1.5
    assert "speculative acceptance length" in snap.reason


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_server_that_ignores_sigterm_is_killed_and_verified(daemon, sim, engine: str) -> None:  # type: ignore[no-untyped-def]
    s = sim("ignore_sigterm", engine=engine)
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    async with httpx.AsyncClient() as c:
        assert (await c.post(f"{r.api}/stop", json={})).status_code == 202
    await r.wait_for(lambda x: x.state == "stopped", 30, "stopped")
    stopped = [e for e in events(s) if e["event"] == "server_stopped"][-1]
    assert stopped["survivors"] == [] and stopped["port_free"] is True and stopped["killed"]


async def test_one_ladder_crosses_engines(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """SGLang with EAGLE-3 deadlocks after the load (as long as a rung lacks `--enforce-eager`, which
    only vLLM has); the ladder steps down to vLLM without speculation, which serves."""
    s = sim(
        "deadlock_after_load",
        args=SPEC,
        env={"SGLANG_SIM_UNLESS": "enforce-eager"},
        fallback=[
            {"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}},
            vllm_rung("vllm-no-spec", str(tmp_path / "model"), 2, **{"enforce-eager": True}),
        ],
    )
    r = await daemon(s)
    snap = await r.wait_for(lambda x: ready(x) and x.rung == "vllm-no-spec", 60, "serving on the vLLM rung")
    assert snap.engine == "vllm" and snap.ladder_engines == ("sglang", "sglang", "vllm")
    assert incident(snap).cause == "startup_stall" and incident(snap).rung == "no-cuda-graph"
    launched = [(e["rung"], e["engine"], e["argv"]) for e in events(s) if e["event"] == "server_launched"]
    assert [(r_, e_) for r_, e_, _ in launched] == [
        ("base", "sglang"),
        ("no-cuda-graph", "sglang"),
        ("vllm-no-spec", "vllm"),
    ]
    argv = launched[-1][2]
    assert "--engine" in argv and "--model" in argv and "--enforce-eager" in argv
    assert "--speculative-algorithm" not in argv and "--model-path" not in argv  # its own set of arguments
    async with httpx.AsyncClient() as c:
        status = (await c.get(f"{r.api}/status")).json()
        got = await c.post(f"http://127.0.0.1:{s.server.port}/v1/completions", json={"prompt": [1], "max_tokens": 2})
    assert status["engine"] == "vllm" and status["ladder_engines"] == ["sglang", "sglang", "vllm"]
    assert got.status_code == 200 and got.json()["choices"]
