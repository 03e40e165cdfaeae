"""Issue 38: a server on a fallback rung is its own condition, through the running daemon and the
real simulator: `status` exits 10 and says why, `/metrics` has the gauge, `promote` tries the
preferred rung now (and the ladder steps down again when it still fails, without charging the rung
that served), and `start` out of `failed` begins at the preferred rung, as the cooldown does."""

from __future__ import annotations

import argparse
import asyncio
import json
import re

import httpx
import pytest

from supervisor.cli import build_parser
from supervisor.client.verbs import run_client
from supervisor.common.exitcodes import EXIT_FAILED, EXIT_FALLBACK, EXIT_OK

pytestmark = pytest.mark.integration
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")
LADDER = {
    "env": {"SGLANG_SIM_UNLESS": "disable-cuda-graph"},  # the base rung crashes while loading
    "restart": {"retries_per_rung": 0, "failed_cooldown_s": 0},
    "fallback": [{"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}],
}


async def cli(api: str, *argv: str) -> int:
    args: argparse.Namespace = build_parser().parse_args([argv[0], "--url", api, *argv[1:]])
    return await asyncio.to_thread(run_client, args, {})


def printed(capsys: pytest.CaptureFixture[str]) -> str:
    return "\n".join(x for x in capsys.readouterr().out.splitlines() if not LOG_LINE.match(x))


def launches(r) -> list[str]:  # type: ignore[no-untyped-def]
    lines = (r.settings.state_dir / "events.jsonl").read_text().splitlines()
    return [e["rung"] for e in map(json.loads, lines) if e["event"] == "server_launched"]


async def test_a_fallback_is_seen_and_promote_tries_the_preferred_rung(daemon, sim, capsys) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("crash_on_load", tp=1, **LADDER))
    await r.wait_for(lambda x: x.state == "ready" and x.rung == "no-cuda-graph", 60, "ready on the fallback")
    capsys.readouterr()
    assert await cli(r.api, "status") == EXIT_FALLBACK
    out = printed(capsys)
    assert "serving on fallback rung no-cuda-graph, not the preferred base" in out
    assert "last failure exited on base" in out and "sglang-supervisor promote" in out
    async with httpx.AsyncClient(timeout=10) as c:
        metrics = (await c.get(f"{r.api}/metrics")).text
        assert "sglang_supervisor_serving_on_fallback 1.0" in metrics
        page = (await c.get(f"{r.api}/ui")).text
        assert "data-fallback='true'" in page and "id='fallback'" in page

    before = r.snap().started_at
    assert await cli(r.api, "promote", "--reason", "driver fixed") == EXIT_OK
    answer = printed(capsys)
    assert "promoting from no-cuda-graph to base" in answer and "base last failed with exited" in answer
    assert "if it fails before it serves: back to no-cuda-graph, no backoff" in answer
    # base still crashes here: straight back to the fallback that served (issue 49)
    def back(x) -> bool:  # type: ignore[no-untyped-def]
        return bool(x.state == "ready" and x.rung == "no-cuda-graph" and x.started_at != before)

    await r.wait_for(back, 60, "back on the fallback")
    assert launches(r) == ["base", "no-cuda-graph", "base", "no-cuda-graph"]
    events = [json.loads(x) for x in (r.settings.state_dir / "events.jsonl").read_text().splitlines()]
    command = next(e for e in events if e["event"] == "command" and e["kind"] == "restart")
    assert command["rung"] == "base" and command["reason"] == "driver fixed"
    assert command["requested_by"] == "anonymous from 127.0.0.1"


async def test_start_out_of_failed_begins_at_the_preferred_rung(daemon, sim, capsys) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        "crash_on_load",
        tp=1,
        restart={"retries_per_rung": 0, "failed_cooldown_s": 0},
        fallback=[{"name": "second", "args": {"disable-custom-all-reduce": True}}],
    )
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "failed", 60, "failed")
    capsys.readouterr()
    assert await cli(r.api, "status") == EXIT_FAILED
    assert launches(r) == ["base", "second"]
    assert await cli(r.api, "start") == EXIT_OK
    await r.wait_for(lambda x: len(launches(r)) >= 3, 60, "a launch after start")
    assert launches(r)[2] == "base"  # where the cooldown would start, not the last rung tried


async def test_logs_previous_shows_the_crashed_launch(daemon, sim, capsys) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("crash_on_load", tp=1, **LADDER))
    await r.wait_for(lambda x: x.state == "ready" and x.rung == "no-cuda-graph", 60, "ready on the fallback")
    capsys.readouterr()
    assert await cli(r.api, "logs", "--previous", "-n", "200") == EXIT_OK
    seen = capsys.readouterr()
    out = "\n".join(x for x in seen.out.splitlines() if not LOG_LINE.match(x))
    assert "torch.OutOfMemoryError: CUDA out of memory" in out  # the base rung's crash
    assert "fired up and ready to roll" not in out  # nothing of the launch now serving
    assert "the launch before this one: rung=base; pid=" in seen.err
    assert await cli(r.api, "logs", "-n", "200") == EXIT_OK
    assert "fired up and ready to roll" in printed(capsys)
    assert await cli(r.api, "logs", "--previous", "--follow") == 2
