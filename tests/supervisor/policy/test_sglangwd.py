"""SGLang's own watchdog fired: a stall it judged, with the class from its dump. Pure rules."""

from __future__ import annotations

from dataclasses import replace

from observations import obs

from probes.types import SGLangWatchdogFire
from supervisor.config.settings import WatchdogSettings
from supervisor.policy.watchdog import assess, new_history

S = WatchdogSettings(poll_interval_s=2, startup_stall_s=60, startup_timeout_s=3600, cpu_only_stall_s=300)
DUMP = 'Thread 4242 (active+gil): "MainThread"\n    synchronize (torch/cuda/streams.py:225)\n    forward (m.py:1)\n'
IDLE_DUMP = 'Thread 4242 (idle): "MainThread"\n    wait (/usr/lib/python3.12/threading.py:331)\n'


def fire(soft: bool = False, dumps: tuple[tuple[int, str], ...] = ((4242, DUMP),)) -> SGLangWatchdogFire:
    return SGLangWatchdogFire(
        at=5.0, name="Scheduler", timeout_s=300.0, soft=soft, line="Scheduler watchdog timeout (...)", dumps=dumps
    )


def test_while_serving_it_is_a_serving_stall_classified_from_the_dump() -> None:
    v, _ = assess(new_history(0.0), replace(obs(10.0), sglang_watchdog=fire()), 10.0, S, mode="serving")
    assert v.cause == "serving_stall" and v.stall_class == "busy" and v.phase == "serving"
    assert v.reason.startswith("SGLang's own watchdog fired (Scheduler watchdog timeout after 300 s)")
    assert "in synchronize (torch/cuda/streams.py:225)" in v.reason and "killed" not in v.reason


def test_while_starting_and_after_the_tree_died_it_is_still_a_stall_not_an_exit() -> None:
    o = replace(
        obs(10.0, phase="capturing_graphs", alive=False, exit_code=-9), sglang_watchdog=fire(dumps=((1, IDLE_DUMP),))
    )
    v, _ = assess(new_history(0.0), o, 10.0, S, mode="starting")
    assert v.cause == "startup_stall" and v.phase == "capturing_graphs" and v.stall_class == "idle"
    assert "SGLang killed its own tree" in v.reason


def test_a_soft_watchdog_is_no_incident() -> None:
    v, _ = assess(new_history(0.0), replace(obs(10.0), sglang_watchdog=fire(soft=True)), 10.0, S, mode="serving")
    assert not v.is_incident
