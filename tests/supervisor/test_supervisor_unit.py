"""The supervisor's acting, with a fake child, scripted observations and a fake clock: no processes.

The real processes, signals and HTTP are in tests/integration; here the loop's policy is checked
quickly: ready, stall -> evidence -> stop -> next rung, the crash-loop budget, commands.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fakeclock import FakeClock
from fakecontrol import FakeControl
from observations import obs, proc
from prometheus_client import CollectorRegistry

from probes.gpu import GpuProbe
from probes.types import HealthObservation, Observation
from supervisor.config.settings import Settings, settings_from_mapping
from supervisor.daemon.observe import Observer, Target
from supervisor.daemon.owner import Owner
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.status.commands import Command


class ScriptedObserver(Observer):
    """Answers each poll from `script(target, now)` instead of /proc, sockets and NVML."""

    def __init__(self, settings: Settings, clock: FakeClock) -> None:
        super().__init__(settings, GpuProbe(None), clock.monotonic)
        self.clock = clock
        self.script: Callable[[Target, float], Observation] = lambda t, now: obs(now)

    async def observe(self, t: Target) -> Observation:
        return self.script(t, self.clock.now)


def settings(tmp_path: Path, **restart: object) -> Settings:
    return settings_from_mapping(
        {
            "server": {"command": ["sglang-server"], "args": {"tp-size": 2}},
            "fallback": [{"name": "no-graph", "args": {"disable-cuda-graph": True}}],
            "watchdog": {"poll_interval_s": 2, "startup_stall_s": 10, "cpu_only_stall_s": 20},
            "restart": {"retries_per_rung": 0, "backoff_initial_s": 1, "backoff_jitter": 0, **restart},
            "diagnostics": {"gdb": "never", "native": False, "py_spy_timeout_s": 2},
            "paths": {"state_dir": str(tmp_path / "state")},
        }
    )


@pytest.fixture
def rig(tmp_path: Path):  # type: ignore[no-untyped-def]
    clock = FakeClock()
    s = settings(tmp_path)
    control = FakeControl()
    observer = ScriptedObserver(s, clock)
    sup = Owner(
        s,
        clock=clock,
        metrics=lambda snap: SupervisorMetrics(CollectorRegistry(), snap),
        gpu=observer.gpu,
        env={"PATH": os.environ["PATH"], "SGLANG_SUPERVISOR_TOKEN": "t0ps3cret", "NOTIFY_SOCKET": "/x"},
        control=control,
        observer=observer,
        rand=lambda: 0.5,
    )
    yield sup, clock, control, observer
    for c in control.children:
        c.exit(0)


def tree_of(t: Target, now: float, **kw: object) -> Observation:
    alive = kw.pop("alive", True)
    return obs(now, procs=(proc(t.root_pid or 1),), alive=bool(alive), **kw)  # type: ignore[arg-type]


async def ticks(sup: Owner, clock: FakeClock, n: int) -> None:
    for _ in range(n):
        clock.advance(sup.settings.watchdog.poll_interval_s)
        await sup.tick()


async def test_launch_then_ready(rig) -> None:  # type: ignore[no-untyped-def]
    sup, clock, control, observer = rig
    await sup.startup(True)
    assert sup.snapshot().state == "starting"
    argv, env = control.spawned[0]
    assert argv == ("sglang-server", "--tp-size", "2", "--host", "127.0.0.1", "--port", "30000")
    assert "SGLANG_SUPERVISOR_TOKEN" not in env and "NOTIFY_SOCKET" not in env
    observer.script = lambda t, now: tree_of(t, now, ready=True, phase="serving")
    await ticks(sup, clock, 1)
    assert sup.snapshot().state == "starting"  # the line alone is a phase hint
    ok = HealthObservation(at=0.0, ok=True, status_code=200, latency_s=0.01, error="")
    observer.script = lambda t, now: tree_of(t, now, ready=True, phase="serving", accepts=True, owned=True, health=ok)
    await ticks(sup, clock, 1)
    snap = sup.snapshot()
    assert snap.state == "ready" and snap.time_to_ready_s == 4.0 and snap.last_good_rung == "base"


async def test_stall_captures_stops_and_steps_down(rig) -> None:  # type: ignore[no-untyped-def]
    sup, clock, control, observer = rig
    await sup.startup(True)
    observer.script = lambda t, now: tree_of(t, now, phase="allocating_kv")  # nothing ever moves
    await ticks(sup, clock, 4)
    assert sup.snapshot().state == "starting"  # 8 s < 10 s window
    await ticks(sup, clock, 2)  # window passed: incident, evidence, stop, then the backoff's pending timer
    snap = sup.snapshot()
    assert snap.last_incident is not None and snap.last_incident.cause == "startup_stall"
    assert snap.last_incident.hang_class == "idle_deadlock" and snap.last_incident.rung == "base"
    assert snap.last_incident.bundle is not None
    assert control.stops == 1 and snap.state == "restarting" and snap.next_attempt_in_s == 1.0
    assert len(control.spawned) == 1, "nothing launches before the backoff is over"
    await ticks(sup, clock, 1)  # the tick after the deadline carries the pending launch out
    snap = sup.snapshot()
    assert snap.state == "starting" and snap.rung == "no-graph" and snap.next_attempt_in_s is None
    assert "--disable-cuda-graph" in control.spawned[1][0]
    events = [e["event"] for e in sup.journal.read(100)]
    for name in ("incident", "bundle_written", "server_stopped", "ladder_decision", "server_launched"):
        assert name in events


async def test_crash_loop_backs_off_and_fails_on_budget(rig) -> None:  # type: ignore[no-untyped-def]
    sup, clock, control, observer = rig
    sup.settings = settings(Path(sup.settings.paths.state_dir).parent, retries_per_rung=10, max_restarts_per_hour=3)
    await sup.startup(True)

    def dead(t: Target, now: float) -> Observation:
        control.children[-1].exit(1)
        return tree_of(t, now, alive=False, exit_code=1)

    observer.script = dead
    delays = []
    for _ in range(6):
        await ticks(sup, clock, 1)  # the server is found dead: incident, stop, the ladder's decision
        snap = sup.snapshot()
        if snap.state == "failed":
            break
        assert snap.state == "restarting" and snap.next_attempt_in_s is not None
        delays.append(snap.next_attempt_in_s)
        launched = len(control.spawned)
        clock.advance(snap.next_attempt_in_s)
        await sup.tick()  # the pending timer is due: the relaunch
        assert len(control.spawned) == launched + 1 and sup.snapshot().state == "starting"
    snap = sup.snapshot()
    assert snap.state == "failed" and "budget" in snap.reason and snap.restarts == 3
    assert delays[0] < delays[1] < delays[2], f"delays grow: {delays}"


async def test_commands_answered_at_once_when_they_conflict(rig) -> None:  # type: ignore[no-untyped-def]
    sup, _clock, _control, _observer = rig
    await sup.startup(True)
    r = await sup.submit(Command(kind="restart", rung="nope"))
    assert r.outcome == "invalid" and "base, no-graph" in r.message
    r = await sup.submit(Command(kind="start"))  # running already: done, as a stop of a stopped one (issue 53)
    assert r.outcome == "done" and r.message.startswith("already running (state ")
    r = await sup.submit(Command(kind="start", rung="no-graph"))  # a rung the running server is not on
    assert r.outcome == "conflict"
    sup.inhand.restart_pending = True
    r = await sup.submit(Command(kind="restart"))
    assert r.outcome == "conflict"


async def test_stop_command_stops_the_tree(rig) -> None:  # type: ignore[no-untyped-def]
    sup, _clock, control, _observer = rig
    await sup.startup(True)
    t = asyncio.ensure_future(sup.submit(Command(kind="stop", reason="maintenance")))
    handled = await sup.next_command(1.0)
    assert handled is not None
    await sup.handle(handled)
    assert (await t).outcome == "accepted"
    assert sup.snapshot().state == "stopped" and control.stops == 1 and sup.snapshot().reason == "maintenance"


async def test_a_launch_that_cannot_start_is_failed_at_once_not_a_walk_down_the_ladder(rig) -> None:  # type: ignore[no-untyped-def]
    sup, _clock, control, _observer = rig
    control.fail_spawn = True
    sup.settings = settings(Path(sup.settings.paths.state_dir).parent, max_restarts_per_hour=2, retries_per_rung=5)
    await sup.startup(True)
    snap = sup.snapshot()
    assert snap.state == "failed" and snap.last_incident is not None and snap.last_incident.cause == "exited"
    assert "no such file" in snap.last_incident.detail and "no such file" in snap.reason
    assert snap.restarts == 0
    names = [json.loads(x)["event"] for x in (sup.state_dir / "events.jsonl").read_text().splitlines()]
    assert names.count("spawn_failed") == 1 and "ladder_decision" not in names


async def test_secrets_stay_out_of_the_journal_and_check_config(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from supervisor.checkconfig.argcheck import check_rungs

    clock = FakeClock()
    s = settings_from_mapping(
        {
            "server": {
                "command": ["sglang-server"],
                "args": {"api-key": "sk-live-123456", "model-path": "https://bob:hunter2pass@models.example/m"},
                "env": {"HF_TOKEN": "hf_abcdefgh123"},
            },
            "paths": {"state_dir": str(tmp_path / "state")},
        }
    )
    control = FakeControl()
    observer = ScriptedObserver(s, clock)
    sup = Owner(
        s,
        clock=clock,
        metrics=lambda snap: SupervisorMetrics(CollectorRegistry(), snap),
        gpu=observer.gpu,
        env={},
        control=control,
        observer=observer,
    )
    await sup.startup(True)
    assert control.spawned[0][1]["HF_TOKEN"] == "hf_abcdefgh123"  # the server itself gets it
    journal = (tmp_path / "state" / "events.jsonl").read_text()
    check_rungs(s, validate=False, out=sys.stdout)
    printed = capsys.readouterr()
    for secret in ("sk-live-123456", "hunter2pass", "hf_abcdefgh123"):
        assert secret not in journal and secret not in printed.out and secret not in printed.err
    assert "--api-key" in journal
    for c in control.children:
        c.exit(0)


async def test_manual_restart_answers_with_the_incident_it_records(rig) -> None:  # type: ignore[no-untyped-def]
    sup, clock, control, _observer = rig
    await sup.startup(True)
    t = asyncio.ensure_future(sup.submit(Command(kind="restart", rung="no-graph", reason="operator")))
    cmd = await sup.next_command(1.0)
    assert cmd is not None
    clock.advance(3.0)  # the restart itself takes a while
    await sup.handle(cmd)
    answer = await t
    assert answer.outcome == "accepted" and answer.incident_id is not None
    snap = sup.snapshot()
    assert snap.last_incident is not None and snap.last_incident.id == answer.incident_id
    assert snap.last_incident.cause == "manual" and snap.rung == "no-graph" and snap.restarts == 0
    assert "--disable-cuda-graph" in control.spawned[-1][0]


# ---- one owner: the pending timer, the one dispatcher, one validation, record() -----------------


async def crash_into_backoff(
    sup: Owner, clock: FakeClock, control: FakeControl, observer: ScriptedObserver
) -> None:
    """Launch, then the server dies: the ladder decides a relaunch after a backoff (a pending timer)."""
    await sup.startup(True)

    def dead(t: Target, now: float) -> Observation:
        control.children[-1].exit(1)
        return tree_of(t, now, alive=False, exit_code=1)

    observer.script = dead
    await ticks(sup, clock, 1)
    observer.script = lambda t, now: tree_of(t, now, phase="loading")
    assert sup.snapshot().state == "restarting" and sup.pending is not None and sup.pending.what == "launch"


async def test_a_stop_during_the_backoff_goes_through_the_one_dispatcher(rig) -> None:  # type: ignore[no-untyped-def]
    sup, clock, control, observer = rig
    sup.settings = settings(Path(sup.settings.paths.state_dir).parent, retries_per_rung=3, backoff_initial_s=30)
    await crash_into_backoff(sup, clock, control, observer)
    t = asyncio.ensure_future(sup.submit(Command(kind="stop", reason="maintenance")))
    cmd = await sup.next_command(1.0)
    assert cmd is not None
    await sup.handle(cmd)
    assert (await t).outcome == "done"
    snap = sup.snapshot()
    assert snap.state == "stopped" and snap.reason == "maintenance" and snap.next_attempt_in_s is None
    assert sup.pending is None
    clock.advance(60)
    await sup.tick()  # past the old deadline: nothing launches
    assert len(control.spawned) == 1 and sup.snapshot().state == "stopped"
    commands = [e for e in sup.journal.read(100) if e["event"] == "command"]
    assert [c["kind"] for c in commands] == ["stop"], "journalled like any command"


async def test_a_start_during_the_backoff_launches_now_on_the_decided_rung(rig) -> None:  # type: ignore[no-untyped-def]
    sup, clock, control, observer = rig
    sup.settings = settings(Path(sup.settings.paths.state_dir).parent, retries_per_rung=0, backoff_initial_s=30)
    await crash_into_backoff(sup, clock, control, observer)
    assert sup.pending is not None and sup.pending.rung == 1, "the ladder stepped down to no-graph"
    t = asyncio.ensure_future(sup.submit(Command(kind="start")))
    cmd = await sup.next_command(1.0)
    assert cmd is not None
    await sup.handle(cmd)
    answer = await t
    assert answer.outcome == "accepted" and answer.message == "relaunching now"
    snap = sup.snapshot()
    assert snap.state == "starting" and snap.rung == "no-graph" and sup.pending is None
    assert "--disable-cuda-graph" in control.spawned[-1][0]


async def test_failed_cooldown_is_the_same_pending_timer(rig) -> None:  # type: ignore[no-untyped-def]
    sup, clock, control, _observer = rig
    sup.settings = settings(Path(sup.settings.paths.state_dir).parent, failed_cooldown_s=50)
    control.fail_spawn = True
    await sup.startup(True)
    snap = sup.snapshot()
    assert snap.state == "failed" and snap.next_attempt_in_s == 50.0
    assert sup.pending is not None and sup.pending.what == "leave_failed"
    clock.advance(20)
    await sup.tick()
    assert sup.snapshot().state == "failed" and sup.snapshot().next_attempt_in_s == 30.0
    control.fail_spawn = False
    clock.advance(30)
    await sup.tick()
    assert sup.snapshot().state == "starting" and len(control.spawned) == 1
    assert "failed_cooldown_over" in [e["event"] for e in sup.journal.read(100)]


async def test_leaving_the_state_a_timer_waits_in_cancels_it(rig) -> None:  # type: ignore[no-untyped-def]
    sup, clock, control, observer = rig
    sup.settings = settings(Path(sup.settings.paths.state_dir).parent, retries_per_rung=3, backoff_initial_s=30)
    await crash_into_backoff(sup, clock, control, observer)
    from supervisor.policy.lifecycle import State

    sup.move(State.STOPPED, "by hand")
    assert sup.pending is None and sup.snapshot().next_attempt_in_s is None


async def test_one_validation_at_submit_and_in_the_queue(rig) -> None:  # type: ignore[no-untyped-def]
    sup, _clock, _control, _observer = rig
    await sup.startup(True)  # starting
    restart, diagnose = Command(kind="restart"), Command(kind="diagnose")
    assert sup.check(restart, queued=False) is None and sup.check(restart, queued=True) is None
    sup.inhand.restart_pending = True  # one restart queued: a second is refused at submit, not in the queue
    r = sup.check(restart, queued=False)
    assert r is not None and r.outcome == "conflict"
    assert sup.check(restart, queued=True) is None
    sup.inhand.diagnosing = True
    r = sup.check(diagnose, queued=False)
    assert r is not None and r.outcome == "busy"
    assert sup.check(diagnose, queued=True) is None
    r = sup.check(Command(kind="restart", rung="nope"), queued=True)
    assert r is not None and r.outcome == "invalid"
    r = sup.check(Command(kind="start"), queued=True)
    assert r is not None and r.outcome == "done" and "starting" in r.message
    for kind in ("reload", "shutdown", "handoff", "stop"):
        assert sup.check(Command(kind=kind), queued=True) is None  # type: ignore[arg-type]


async def test_every_command_kind_has_its_handler() -> None:
    from typing import get_args

    from supervisor.status.commands import CommandKind

    for kind in get_args(CommandKind):
        assert callable(getattr(Owner, f"handle_{kind}", None)), kind


async def test_record_writes_the_journal_and_the_log_line_with_the_launch_bound(rig) -> None:  # type: ignore[no-untyped-def]
    from structlog.testing import capture_logs

    sup, _clock, control, _observer = rig
    with capture_logs() as logs:
        await sup.startup(True)
        await sup.handle(Command(kind="stop", reason="done"))
    launched = next(e for e in sup.journal.read(100) if e["event"] == "server_launched")
    line = next(x for x in logs if x["event"] == "server_launched")
    assert line["argv"] == launched["argv"] and line["pid"] == launched["pid"] == control.children[0].pid
    changed = [x for x in logs if x["event"] == "state_changed" and x["new"] == "starting"]
    assert changed and changed[0]["pid"] == control.children[0].pid and changed[0]["rung"] == "base"
    stopped = next(x for x in logs if x["event"] == "server_stopped")
    assert stopped["pid"] is None, "after the stop, lines carry no pid"
    assert sup.journal.read(100)[-1]["event"] == "state_changed"


async def test_the_leftovers_sweep_gets_the_saved_and_the_derived_marker(rig) -> None:  # type: ignore[no-untyped-def]
    from supervisor.daemon.persist import marker_for

    sup, _clock, control, _observer = rig
    sup.marker = "older0version0marker"
    await sup.startup(True)
    assert control.swept == [("older0version0marker", marker_for(sup.state_dir))]


async def test_an_incidents_lines_name_it_and_the_relaunch_does_not(rig) -> None:  # type: ignore[no-untyped-def]
    from structlog.testing import capture_logs

    sup, clock, _control, observer = rig
    await sup.startup(True)
    observer.script = lambda t, now: tree_of(t, now, phase="allocating_kv")  # nothing ever moves
    with capture_logs() as logs:
        await ticks(sup, clock, 7)  # the stall, its capture and stop, then the relaunch after the backoff
    incident = sup.snapshot().last_incident
    assert incident is not None
    for event in ("server_stopped", "ladder_decision"):
        line = next(x for x in logs if x["event"] == event)
        assert line["incident"] == incident.id, event
    relaunched = next(x for x in logs if x["event"] == "server_launched")
    assert "incident" not in relaunched and relaunched["rung"] == "no-graph"


async def test_the_self_check_runs_again_hourly_and_clears_when_fixed(rig, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sup, clock, _, _ = rig
    later = tmp_path / "bin" / "py-spy"
    sup.settings = sup.settings.model_copy(
        update={"diagnostics": sup.settings.diagnostics.model_copy(update={"py_spy_path": str(later)})}
    )
    await sup.startup(True)
    assert not next(c for c in sup.snapshot().selfcheck if c.name == "py-spy").ok
    later.parent.mkdir()
    later.write_text("#!/bin/sh\necho py-spy 0.4.0\n")
    later.chmod(0o755)
    await ticks(sup, clock, 3)  # minutes: not yet
    assert not next(c for c in sup.snapshot().selfcheck if c.name == "py-spy").ok
    clock.advance(3600)
    await sup.tick()
    spy = next(c for c in sup.snapshot().selfcheck if c.name == "py-spy")
    assert spy.ok and "py-spy 0.4.0" in spy.detail


async def test_the_py_spy_look_waits_for_half_the_window_the_verdict_uses(tmp_path: Path) -> None:
    """Issue 48: the look and the verdict read one window. With a learned window (20 s, the floor) in
    force against a configured 90 s, a start where only CPU moves is looked at after 10 s, not 45 s."""
    from supervisor.policy.learned import Learned
    from supervisor.warmstart.timeline import BookEntry
    from supervisor.warmstart.warm import key_for

    clock = FakeClock()
    t0 = clock.now
    s = settings(tmp_path).model_copy(deep=True)
    wd = s.watchdog.model_copy(update={"startup_stall_s": 90, "cpu_only_stall_s": 180})
    s = s.model_copy(update={"watchdog": wd})
    control, observer = FakeControl(), ScriptedObserver(s, clock)
    sup = Owner(
        s,
        clock=clock,
        metrics=lambda snap: SupervisorMetrics(CollectorRegistry(), snap),
        gpu=observer.gpu,
        env={"PATH": os.environ["PATH"]},
        control=control,
        observer=observer,
        rand=lambda: 0.5,
    )
    argv = ["sglang-server", "--tp-size", "2", "--host", "127.0.0.1", "--port", "30000"]
    learned = Learned(starts=2, quiet_s={"allocating_kv": 0.5})
    sup.warm.book.put(BookEntry(key_for(argv, "base", sup.warm.host), learned, None))
    looks: list[tuple[float, bool]] = []

    def script(t: Target, now: float) -> Observation:
        looks.append((now, t.look))
        return tree_of(t, now, phase="allocating_kv", cpu=now)  # CPU alone moves

    observer.script = script
    try:
        await sup.startup(True)
        assert control.spawned[0][0] == tuple(argv)
        await ticks(sup, clock, 7)  # 14 s
        assert sup.snapshot().stall_window is not None and sup.snapshot().stall_window.window_s == 20.0
        looked_at = [at for at, look in looks if look]
        assert looked_at and looked_at[0] - t0 <= 12.0, looks
    finally:
        for c in control.children:
            c.exit(0)


@pytest.mark.parametrize("jump", ["both+1h", "wall+1h", "wall-1h"])
async def test_a_clock_jump_during_a_start_is_no_verdict(rig, jump: str) -> None:  # type: ignore[no-untyped-def]
    """Issue 50: a +1 h jump of both clocks during a start tripped the `startup_timeout` backstop (3,600 s)
    at once. The windows count time the daemon watched, on the monotonic clock: a jump of the wall clock
    alone moves nothing, and a poll whose monotonic gap is far past any poll interval (the daemon's clock
    jumped, or it was stopped) does not count that gap against the server."""
    sup, clock, control, observer = rig
    assert sup.settings.watchdog.startup_timeout_s == 3600
    await sup.startup(True)
    lines = iter(range(10, 10_000))
    observer.script = lambda t, now: tree_of(t, now, phase="loading_weights", lines=next(lines))  # the log moves
    await ticks(sup, clock, 3)
    if jump == "both+1h":
        clock.advance(3600.0)
    else:
        clock.jump_wall(3600.0 if jump == "wall+1h" else -3600.0)
    await ticks(sup, clock, 3)
    snap = sup.snapshot()
    assert snap.state == "starting" and snap.last_incident is None, (snap.state, snap.reason)
    assert control.stops == 0 and len(control.spawned) == 1
    # The backstop still stands on watched time: an hour of polls that each move the log ends the start.
    for _ in range(1900):
        await ticks(sup, clock, 1)
        if sup.snapshot().last_incident is not None:
            break
    inc = sup.snapshot().last_incident
    assert inc is not None and inc.cause == "startup_timeout"
