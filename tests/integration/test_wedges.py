"""Issue 51: wedges that /health does not see, through the running daemon. SGLang #40809 (the scheduler
admits nothing more: requests queue, none starts), #28815 (an EAGLE verify step skips its broadcast on
rank 0: the running batch never finishes) and vLLM's admission wedge are judged `serving_stall` about a
serving window after they begin, with /health 200 all along, from the engines' own metrics; the bundle
is written and the server relaunched. A busy server with a standing queue whose tokens move is left
alone, and an idle vLLM gets its canary generation at most once a window."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import SPEC, ready, traffic

pytestmark = pytest.mark.integration

# The relaunch serves: the wedge happened once (the onset file says so).
ONCE = {"SGLANG_SIM_FAULT_ONCE": "1"}

WEDGES = [
    # (case, engine, scenario, tp, extra args)
    ("sglang_40809_queue_wedge", "sglang", "queue_wedge", 1, None),
    ("sglang_28815_verify_skips_broadcast", "sglang", "verify_skips_broadcast", 2, SPEC),
    ("vllm_queue_wedge", "vllm", "queue_wedge", 1, None),
]


@pytest.mark.parametrize(("case", "engine", "scenario", "tp", "args"), WEDGES, ids=[w[0] for w in WEDGES])
async def test_a_wedge_with_health_200_is_a_serving_stall_within_the_window(  # type: ignore[no-untyped-def]
    daemon, sim, tmp_path, case: str, engine: str, scenario: str, tp: int, args: dict[str, Any] | None
) -> None:
    onset = tmp_path / "onset.json"
    s = sim(scenario, engine=engine, tp=tp, args=args, env={**ONCE, "SGLANG_SIM_ONSET_FILE": str(onset)})
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    health: list[tuple[bool | None, int | None]] = []  # what /status showed of /health through the wedge
    judged_at: list[float] = []

    def judged(x: Any) -> bool:
        if x.serving.health_status is not None:
            health.append((x.serving.health_ok, x.serving.health_status))
        if x.state in ("hung", "diagnosing", "restarting") and not judged_at:
            judged_at.append(time.monotonic())
        return x.last_incident is not None

    async with traffic(s.server.port, concurrency=3, engine=engine):
        await r.wait_for(lambda _: onset.exists() and json.loads(onset.read_text()).get("onset_monotonic"), 30, "onset")
        snap = await r.wait_for(judged, 40, "serving stall")
    inc = snap.last_incident
    assert inc is not None and inc.cause == "serving_stall", inc
    assert health and health[-1] == (True, 200), health[-5:]  # /health never saw it
    # Judged from the engine's own metrics about a window after the onset (its counters' last movement
    # may follow the onset by the batch that drains), never a window early.
    late = (judged_at[0] if judged_at else time.monotonic()) - json.loads(onset.read_text())["onset_monotonic"]
    window, poll = s.watchdog.serving_stall_s, s.watchdog.poll_interval_s
    print(f"DETECTION {case}: {late:.2f} s after the onset (window {window:g} s, poll {poll:g} s): {inc.detail}")
    assert window <= late <= window + 12 * poll, f"{late:.2f} s after the onset"
    if scenario == "queue_wedge" and engine == "sglang":
        assert "none started since" in inc.detail, inc.detail
    assert inc.bundle is not None
    summary = json.loads((Path(s.paths.state_dir) / "diagnostics" / inc.bundle / "summary.json").read_text())
    assert summary["phase"] == "serving"
    snap = await r.wait_for(lambda x: ready(x) and x.restarts >= 1, 60, "relaunched and serving")
    assert snap.restarts >= 1


async def test_a_standing_queue_behind_a_moving_batch_is_not_judged(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    """Heavy load: two requests run, six wait for their turn for three windows; tokens move, so the
    queue is load, not a wedge."""
    s = sim("ok", tp=1, args={"max-running-requests": 2})
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    queued: list[float] = []
    async with traffic(s.server.port, concurrency=8, tokens=48) as done:
        for _ in range(int(3 * s.watchdog.serving_stall_s * 10)):
            x = r.snap()
            assert x.state == "ready" and x.last_incident is None, x.reason
            if x.serving.queue_reqs:
                queued.append(x.serving.queue_reqs)
            await asyncio.sleep(0.1)
    assert queued and max(queued) >= 3, queued  # it really queued
    assert len(done) > 8, "the load generator really got answers"
    assert r.snap().incidents == 0


async def test_a_load_of_one_token_requests_is_not_judged(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    """Every request ends in its prefill, so no decode token ever moves while requests wait their turn:
    the requests that finish are the progress (judged a serving stall before issue 51)."""
    s = sim("ok", tp=1, args={"max-running-requests": 2})
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    async with traffic(s.server.port, concurrency=6, tokens=1) as done:
        for _ in range(int(3 * s.watchdog.serving_stall_s * 10)):
            x = r.snap()
            assert x.state == "ready" and x.last_incident is None, x.reason
            await asyncio.sleep(0.1)
    assert len(done) > 20, "the load generator really got answers"
    assert r.snap().incidents == 0


async def test_an_idle_vllm_gets_its_canary_at_most_once_a_window(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    """vLLM's /health is a flag, so the daemon adds a one-token generation; an idle server gets it at
    most once a serving window, not with every health check. Counted where the simulator counts what
    it serves: its `http_requests_total` for /v1/completions."""
    s = sim("ok", engine="vllm", tp=1)
    r = await daemon(s)
    await r.wait_for(ready, 30, "ready")
    url = f"http://127.0.0.1:{s.server.port}/metrics"

    async def completions() -> float:
        async with httpx.AsyncClient(timeout=10) as c:
            text = (await c.get(url)).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("http_requests_total{") and 'handler="/v1/completions"' in line
        )

    window, health_s = s.watchdog.serving_stall_s, s.watchdog.health_interval_s
    windows = 3
    before, tic = await completions(), time.monotonic()
    await asyncio.sleep(windows * window + 1.0)
    sent, spent = await completions() - before, time.monotonic() - tic
    print(f"CANARY {sent:.0f} canaries in {spent:.1f} s idle (window {window:g} s, health every {health_s:g} s)")
    assert sent <= spent / window + 1, (sent, spent)  # at most once a window (the first may be due at once)
    assert sent >= 2, sent  # and it still goes: a wedge behind the flag is still found within a window
    assert r.snap().state == "ready" and r.snap().incidents == 0
