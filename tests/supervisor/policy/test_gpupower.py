"""Busy hangs without GPM (issue 35): the power rule's table, and the rule inside the start-up watchdog."""

from __future__ import annotations

from dataclasses import replace

import pytest
from observations import obs

from probes.types import GpmObservation, GpuDevice, GpuObservation, GpuProcess
from supervisor.config.settings import WatchdogSettings
from supervisor.policy.gpupower import learn_idle, power_spinning, readings, spinning_by_power
from supervisor.policy.gpuwait import BusyState, fold_busy, gpu_bound
from supervisor.policy.watchdog import assess, new_history

S = WatchdogSettings(poll_interval_s=2, startup_stall_s=60, startup_timeout_s=3600, cpu_only_stall_s=900)
GB = 1 << 30


@pytest.mark.parametrize(
    ("util", "power", "idle", "limit", "expected"),
    [
        (100.0, 25.0, 22.0, 350.0, True),  # sglang#35822: EAGLE verify hang, 100 % and about 25 W (L40S-like)
        (100.0, 95.0, 75.0, 700.0, True),  # one spinning kernel on an H200-class board: 3 % of the span
        (100.0, 420.0, 75.0, 700.0, False),  # real work at 100 %: well into the span
        (30.0, 80.0, 75.0, 700.0, False),  # not busy by NVML: not a busy hang at all
        (100.0, 137.5, 75.0, 700.0, True),  # exactly the 10 % fraction: still a spin
        (100.0, 139.0, 75.0, 700.0, False),  # just above it
        (100.0, None, 75.0, 700.0, None),  # no power reading (Not Supported)
        (100.0, 90.0, None, 700.0, None),  # no idle reference learned yet
        (100.0, 90.0, 75.0, None, None),  # no power limit
        (100.0, 90.0, 75.0, 60.0, None),  # a limit not above idle: nothing to measure against
        (100.0, 60.0, 75.0, 700.0, True),  # below the learned idle (clocks dropped further): a spin
    ],
)
def test_power_spinning(util, power, idle, limit, expected) -> None:  # type: ignore[no-untyped-def]
    assert power_spinning(util, power, idle, limit, S.busy_gpu_percent, S.power_spin_fraction) is expected


def gpu(util: float, power: float | None, *, limit: float | None = 700.0, n: int = 1) -> GpuObservation:
    return GpuObservation(
        status="ok",
        reason="",
        devices=tuple(GpuDevice(i, f"GPU-{i}", "A100", util, 0, 80 * GB, power, limit) for i in range(n)),
        processes=(GpuProcess(100, 0, "GPU-0", GB),),
    )


def test_idle_is_learned_only_where_nothing_runs() -> None:
    idle = learn_idle((), gpu(0.0, 80.0))
    idle = learn_idle(idle, gpu(0.0, 75.0))
    idle = learn_idle(idle, gpu(100.0, 60.0))  # a reading with a kernel resident teaches nothing
    assert idle == ((0, 75.0),)
    assert learn_idle(idle, GpuObservation("unavailable", "no NVML")) == idle


def test_the_trees_gpus_decide_and_one_working_gpu_is_not_a_spin() -> None:
    two = replace(gpu(100.0, 90.0, n=2), processes=(GpuProcess(100, 0, "GPU-0", GB), GpuProcess(100, 1, "GPU-1", GB)))
    rs = readings(two, ((0, 75.0), (1, 75.0)), None, (0, 1))
    assert spinning_by_power(rs, 50.0, 0.1) is not None
    working = replace(two, devices=(two.devices[0], replace(two.devices[1], power_w=500.0)))
    assert spinning_by_power(readings(working, ((0, 75.0), (1, 75.0)), None, (0, 1)), 50.0, 0.1) is None
    # the configured idle power stands in for a learned one
    assert spinning_by_power(readings(gpu(100.0, 90.0), (), 75.0, (0,)), 50.0, 0.1) is not None
    assert readings(gpu(100.0, 90.0), (), None, (0,)) == ()  # nothing learned, nothing set: no judgement


def spin_seq(t_end: float, *, power: float, gpm_ok: bool = False) -> list:  # type: ignore[type-arg]
    """Idle GPU at t=0..10 (the server loading: the idle power is learned), then a capture that logged
    its last line at t=10 and only CPU moves, the GPU at 100 % drawing `power`."""
    out = [replace(obs(float(t_), cpu=1.0, lines=20, line_at=float(t_)), gpu=gpu(0.0, 75.0)) for t_ in (0, 2, 4)]
    out.append(replace(obs(10.0, cpu=10.0, lines=20, phase="capturing_graphs", line_at=10.0), gpu=gpu(0.0, 75.0)))
    t_ = 12.0
    while t_ <= t_end:
        o = obs(t_, cpu=t_, lines=20, phase="capturing_graphs")
        o = replace(o, gpu=gpu(100.0, power))
        if gpm_ok:
            o = replace(o, gpm=GpmObservation("ok", "", ()))
        out.append(o)
        t_ += 2.0
    return out


def run(seq: list):  # type: ignore[no-untyped-def, type-arg]
    h = new_history(0.0)
    for o in seq:
        v, h = assess(h, o, o.at, S, mode="starting")
        if v.is_incident:
            return v, h
    return v, h


def test_a_spin_by_power_is_a_stall_at_the_window_not_at_cpu_only() -> None:
    v, _ = run(spin_seq(1000.0, power=95.0))
    assert v.cause == "startup_stall" and v.stall_class == "busy", v
    since = dict(v.figures)["since_progress_s"]
    assert S.startup_stall_s <= since <= S.startup_stall_s + 2 * S.poll_interval_s
    assert "power: GPU 0 util 100 % at 95 W, 3% of the way from idle 75 W to its 700 W limit" in v.reason, v.reason
    assert "power_spin_s" in dict(v.figures)


def test_work_by_power_is_left_to_the_cpu_only_backstop() -> None:
    v, _ = run(spin_seq(200.0, power=450.0))
    assert not v.is_incident, v  # drawing like work: CPU that moves may be progress


def test_gpm_where_there_is_one_is_the_signal_not_power() -> None:
    b = BusyState(idle_power=((0, 75.0),))
    o = replace(obs(20.0), gpu=gpu(100.0, 95.0), gpm=GpmObservation("ok", "", ()))
    assert fold_busy(b, o, 20.0, False, S).power_since is None
    o = replace(o, gpm=GpmObservation("unavailable", "MIG"))
    folded = fold_busy(b, o, 20.0, False, S)
    assert folded.power_since == 20.0 and gpu_bound(folded, 80.0, S).startswith("power: GPU 0")
    assert gpu_bound(replace(folded, kinds=("compile",)), 80.0, S) == ""  # a compiler times kernels
