"""The backoff after an incident counts from the verdict: what the evidence and the stop took is not
waited for again (issue 36, the daemon's share of an outage)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from observations import obs

from supervisor.config.settings import settings_from_mapping
from supervisor.policy.learned import Learned
from supervisor.policy.watchdog import new_history
from supervisor.warmstart.timeline import BookEntry
from supervisor.warmstart.warm import WarmStart, key_for


def warm_start(tmp_path: Path) -> WarmStart:
    s = settings_from_mapping(
        {"server": {"command": ["python3", "-m", "sglang.launch_server"]}, "paths": {"state_dir": str(tmp_path)}}
    )
    events: list[tuple[Any, ...]] = []
    return WarmStart(s, lambda *a, **kw: events.append((a, kw)), host="h")


async def test_the_backoff_left_is_what_the_evidence_and_stop_did_not_already_wait(tmp_path: Path) -> None:
    c = warm_start(tmp_path)
    assert c.backoff_left(1.0, 100.0) == 1.0  # no verdict yet: the whole backoff
    c.incident("i1", "startup_stall", None, 100.0)
    assert abs(c.backoff_left(1.0, 100.2) - 0.8) < 1e-9
    assert c.backoff_left(1.0, 103.5) == 0.0  # evidence 3 s, stop 0.5 s: the attempts are spaced already
    assert c.backoff_left(8.0, 103.5) == 4.5  # a longer backoff (a crash loop's doubling) still holds
    assert c.backoff_left(1.0, 99.0) == 1.0  # a clock that went back never lengthens it
    c.incident("i2", "exited", None, 200.0)  # the next incident counts from its own verdict
    assert c.backoff_left(2.0, 200.5) == 1.5


async def test_the_first_launch_after_a_gpu_fault_waits_the_configured_window_and_teaches_nothing(
    tmp_path: Path,
) -> None:
    c = warm_start(tmp_path)
    wd = c.settings.watchdog.model_copy(update={"startup_stall_s": 180.0})
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/m"]
    key = key_for(argv, "base", "h")
    c.book.put(BookEntry(key, Learned(starts=2, quiet_s={"allocating_kv": 0.5}), None))  # a known model

    await c.launching(argv, "base", {}, 0.0, 1000.0)
    o = obs(10.0, phase="allocating_kv")
    assert c.window(o, new_history(0.0), wd).startup_stall_s == 20.0  # the floor: learned
    assert c.window_now is not None and c.window_now.source == "floor"

    c.gpu_fault(0.5)  # an incident named an Xid read 0.5 s before it
    await c.launching(argv, "base", {}, 100.0, 1100.0)
    got = c.window(obs(110.0, phase="allocating_kv"), new_history(100.0), wd)
    assert got.startup_stall_s == 180.0 and c.window_now is not None and c.window_now.source == "configured"
    assert "GPU fault" in c.window_now.why
    c.ready(150.0, 50.0)
    assert c.book.get(key) is not None and c.book.get(key).learned.starts == 2  # type: ignore[union-attr]

    await c.launching(argv, "base", {}, 200.0, 1200.0)  # the one after it is a learned start again
    assert c.window(obs(210.0, phase="allocating_kv"), new_history(200.0), wd).startup_stall_s == 20.0


async def test_a_good_start_teaches_every_start_up_phase_even_one_passed_between_two_polls(tmp_path: Path) -> None:
    """As on the device lane: the draft model loaded between two polls of a good start, then a start
    hung in `loading_draft` got the configured 180 s; every phase a ready start went through is learned."""
    c = warm_start(tmp_path)
    wd = c.settings.watchdog.model_copy(update={"startup_stall_s": 180.0})
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/m"]
    await c.launching(argv, "base", {}, 0.0, 1000.0)
    c.window(obs(1.0, phase="loading_weights"), new_history(0.0), wd)  # the only phase a poll saw
    c.ready(5.0, 5.0)
    entry = c.book.get(key_for(argv, "base", "h"))
    assert entry is not None and entry.learned.starts == 1
    assert {"spawning", "initializing", "loading_draft", "allocating_kv", "capturing_graphs", "warming_up"} <= set(
        entry.learned.quiet_s
    )
    await c.launching(argv, "base", {}, 10.0, 1010.0)
    assert c.window(obs(11.0, phase="loading_draft"), new_history(10.0), wd).startup_stall_s == 20.0  # the floor


async def test_the_weights_are_measured_at_an_incident_only_where_configured(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model-00001-of-00001.safetensors").write_bytes(os.urandom(1 << 20))
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", str(model)]
    for measured in (True, False):
        s = settings_from_mapping(
            {
                "server": {"command": ["python3"]},
                "paths": {"state_dir": str(tmp_path / f"state-{measured}")},
                "caches": {"weights_residency": measured, "weights_readahead": False},
            }
        )
        events: list[tuple[Any, ...]] = []
        c = WarmStart(s, lambda *a, _e=events, **kw: _e.append((a, kw)), host="h")
        await c.launching(argv, "base", {}, 0.0, 1000.0)
        c.incident("i1", "startup_stall", None, 10.0)
        await asyncio.gather(*c.tasks)
        looked = [kw for a, kw in events if a and a[0] == "weights_residency"]
        if measured:
            (doc,) = looked
            assert doc["files"] == 1 and doc["bytes"] == 1 << 20 and doc["readahead"] is False
            await c.launching(argv, "base", {}, 20.0, 1020.0)  # the relaunch's timeline carries it
            assert c.current is not None and c.current.residency is not None
        else:
            assert looked == [] and not c.tasks


async def test_a_hang_in_the_relaunch_of_an_operators_restart_is_an_outage_of_its_own(tmp_path: Path) -> None:
    """Issue 49: the operator's restart is booked as requested (its stop is not the daemon's share);
    a start-up hang in its relaunch ends that record at the hang's onset and opens its own, whose
    detection counts from the last progress (before: one record, detection 0.0, daemon share 8 s)."""
    from supervisor.policy.watchdog import Verdict

    events: list[tuple[Any, ...]] = []
    s = settings_from_mapping({"server": {"command": ["python3"]}, "paths": {"state_dir": str(tmp_path)}})
    c = WarmStart(s, lambda *a, **kw: events.append((a, kw)), host="h", monotonic=lambda: 0.0)
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/m"]
    await c.launching(argv, "base", {}, 0.0, 1000.0)
    c.incident("i-manual", "manual", None, 100.0, requested=True)
    c.stopped(108.0)  # stopping the healthy server on request took 8 s
    await c.launching(argv, "base", {}, 108.0, 1108.0)
    hang = Verdict(status="incident", cause="startup_stall", reason="", figures=(("since_progress_s", 20.0),))
    c.incident("i-hang", "startup_stall", hang, 150.0)
    outages = [kw for a, kw in events if a and a[0] == "outage"]
    (manual,) = outages
    assert manual["incident"] == "i-manual" and manual["ended_by"] == "i-hang"
    assert manual["total_s"] == 30.0  # 100 -> 130, the hang's onset
    assert manual["daemon_s"] == 0.0  # the stop was asked for
    c.stopped(151.0)
    await c.launching(argv, "base", {}, 152.0, 1152.0)
    c.ready(160.0, 8.0)
    outages = [kw for a, kw in events if a and a[0] == "outage"]
    hung = outages[-1]
    assert hung["incident"] == "i-hang" and hung["ended_by"] is None
    assert hung["parts"]["detection"] == 20.0 and hung["total_s"] == 30.0  # onset 130 -> ready 160
    assert hung["daemon_s"] == 2.0  # its capture/stop (1 s) and the backoff to the launch (1 s)
