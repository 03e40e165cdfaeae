"""The watchdog's provisional class (used when no bundle could classify): only hang causes get one."""

from __future__ import annotations

import pytest

from supervisor.daemon.evidence import provisional_class
from supervisor.policy.watchdog import Verdict
from supervisor.status.causes import HANG_CLASSES


@pytest.mark.parametrize("cause", ["exited", "manual", "spec_regression"])
def test_a_cause_that_is_no_hang_gets_no_class_whatever_the_watchdog_saw(cause: str) -> None:
    for stall in ("busy", "idle", None):
        assert provisional_class(Verdict("incident", cause, "x", stall_class=stall, phase="serving")) is None
    assert provisional_class(Verdict("incident", cause, "x", stall_class="busy", phase="capturing_graphs")) is None


@pytest.mark.parametrize(
    ("stall", "phase", "expected"),
    [
        ("busy", "serving", "busy_spin"),
        ("idle", "loading_weights", "idle_deadlock"),
        ("busy", "capturing_graphs", "cuda_graph_capture"),
        (None, "spawning", "unknown"),
    ],
)
def test_a_hang_gets_a_hang_class(stall: str | None, phase: str, expected: str) -> None:
    got = provisional_class(Verdict("incident", "startup_stall", "x", stall_class=stall, phase=phase))  # type: ignore[arg-type]
    assert got == expected and got in HANG_CLASSES


def test_no_verdict_no_class() -> None:
    assert provisional_class(None) is None
