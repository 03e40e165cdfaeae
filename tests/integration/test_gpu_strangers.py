"""GPU memory held outside the server, through the running daemon on the simulated GPU (its JSON
file lists a real process as the holder): judged by need under `[slate] gpu_strangers`.

A stranger that leaves the rung's need free does not delay the launch and is named in the journal;
one that leaves too little refuses it with the numbers, is told once the backoff reaches its cap
(an exec hook hears `launch_blocked` naming it), and the launch goes ahead once it fits; the strict
policies refuse any stranger, however small. A stranger is never signalled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from notifyhook import hook, hook_calls, with_notify
from serving import ready
from waiting import until

from supervisor.config.alerting import NotifyTarget
from supervisor.config.settings import Settings
from supervisor.config.slate import SlateSettings

pytestmark = pytest.mark.integration

GIB = 2**30
TOTAL = 141 * GIB


def events(s: Settings) -> list[dict[str, Any]]:
    path = Path(s.paths.state_dir) / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def put_on_gpu(nvml: Path, holders: dict[int, int]) -> None:
    tmp = nvml.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": [{"uuid": "GPU-aaaa", "mem_total": TOTAL, "processes": holders}]}))
    os.replace(tmp, nvml)


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)  # nb.py"])
    yield proc
    proc.kill()
    proc.wait()


def with_slate(s: Settings, **kw: Any) -> Settings:
    return s.model_copy(update={"slate": SlateSettings(**kw)})


async def test_a_small_stranger_does_not_delay_the_launch_and_is_named(daemon, sim, tmp_path: Path, stranger) -> None:  # type: ignore[no-untyped-def]
    nvml = tmp_path / "nvml.json"
    put_on_gpu(nvml, {stranger.pid: int(2.5 * GIB)})  # the outside run's notebook: 2.5 of 141 GiB
    s = sim("ok", tp=1, args={"mem-fraction-static": 0.3}, gpu=nvml)
    r = await daemon(s)
    await r.wait_for(ready, 40, "ready beside the stranger")
    names = [e["event"] for e in events(s)]
    assert "launch_refused" not in names
    (slate,) = [e for e in events(s) if e["event"] == "clean_slate"]
    command = " ".join(f"{sys.executable} -c {stranger.args[2]}".split())  # one line, as reasons show it
    assert slate["gpu_strangers"] == [{"pid": stranger.pid, "gpu": 0, "bytes": int(2.5 * GIB), "command": command}]
    fit = slate["gpu_fit"]
    assert fit["policy"] == "launch" and fit["action"] == "launch" and fit["need"] == "mem-fraction-static 0.3"
    assert fit["gpus"] == [
        {"gpu": 0, "total_bytes": TOTAL, "free_bytes": TOTAL - int(2.5 * GIB), "need_bytes": int(0.3 * TOTAL)}
    ]
    assert stranger.poll() is None


async def test_a_stranger_leaving_too_little_refuses_with_numbers_then_is_told(  # type: ignore[no-untyped-def]
    daemon, sim, tmp_path: Path, stranger
) -> None:
    nvml = tmp_path / "nvml.json"
    put_on_gpu(nvml, {stranger.pid: 138 * GIB})
    out, argv = hook(tmp_path)
    s = sim(
        "ok",
        tp=1,
        args={"mem-fraction-static": 0.3},
        gpu=nvml,
        restart={"backoff_initial_s": 0.3, "backoff_max_s": 1.2},
    )
    s = with_notify(s, NotifyTarget(name="hook", kind="exec", argv=argv))
    r = await daemon(s)
    snap = await r.wait_for(lambda x: "does not fit" in x.reason, 20, "the refusal")
    assert snap.state == "restarting" and snap.pid is None
    numbers = (
        "GPU 0: 3.0 GiB free of 141 GiB, the rung needs 42.3 GiB (mem-fraction-static 0.3); "
        f"held by pid {stranger.pid} ({sys.executable} -c import time"
    )
    assert numbers in snap.reason and "138.0 GiB" in snap.reason, snap.reason
    refused = [e for e in events(s) if e["event"] == "launch_refused"]
    assert refused and numbers in str(refused[0]["gpu"])
    # 0.3, 0.6, 1.2: the third refusal in a row is at the cap, told once, naming the holder.
    await until(lambda: any(c["stdin"]["event"] == "launch_blocked" for c in hook_calls(out)), 20, "launch_blocked")
    (told,) = [c for c in hook_calls(out) if c["stdin"]["event"] == "launch_blocked"]
    assert f"pid {stranger.pid}" in told["stdin"]["summary"] and "3.0 GiB free" in told["stdin"]["reason"]
    (blocked,) = [e for e in events(s) if e["event"] == "launch_blocked"]
    assert blocked["refusals"] == 3 and blocked["rung"] == "base"
    assert stranger.poll() is None  # a stranger is never signalled
    put_on_gpu(nvml, {stranger.pid: 20 * GIB})  # it gave most back: 121 GiB free, 42.3 needed
    await r.wait_for(ready, 40, "launched once it fits")
    await until(lambda: any(c["stdin"]["event"] == "recovered" for c in hook_calls(out)), 20, "recovered")
    assert [e["event"] for e in events(s)].count("launch_blocked") == 1
    assert stranger.poll() is None


@pytest.mark.parametrize("policy", ["wait", "refuse"])
async def test_the_strict_policies_refuse_even_a_tiny_stranger(  # type: ignore[no-untyped-def]
    daemon, sim, tmp_path: Path, stranger, policy: str
) -> None:
    nvml = tmp_path / "nvml.json"
    put_on_gpu(nvml, {stranger.pid: 2**20})  # the adversarial run's 1 MiB holder
    s = with_slate(sim("ok", tp=1, args={"mem-fraction-static": 0.3}, gpu=nvml), gpu_strangers=policy)
    r = await daemon(s)
    want = "restarting" if policy == "wait" else "failed"
    snap = await r.wait_for(lambda x: x.state == want and "gpu_strangers" in x.reason, 20, "the refusal")
    assert f'[slate] gpu_strangers = "{policy}"' in snap.reason and f"pid {stranger.pid}" in snap.reason
    assert f"pid {stranger.pid} ({sys.executable} -c import time" in snap.reason and "1 MiB" in snap.reason
    assert snap.pid is None
    names = [e["event"] for e in events(s)]
    assert "launch_refused" in names and "server_launched" not in names
    if policy == "refuse":  # not retried on the backoff: failed now, the failed cooldown applies
        assert names.count("launch_refused") == 1 and "failed_cooldown" in names
    assert stranger.poll() is None
