"""The rules scripts rely on: status exit codes by state, and when a --wait is over."""

from __future__ import annotations

import pytest

from supervisor.client.wait import STATE_EXIT, Before, settled, state_exit
from supervisor.policy.lifecycle import State

BEFORE = Before(state="ready", started_at="2026-12-01T10:00:00+00:00")
NEW = "2026-12-01T10:05:00+00:00"


def test_every_state_has_its_own_documented_code_and_only_ready_is_zero() -> None:
    assert set(STATE_EXIT) == {s.value for s in State}
    assert [k for k, v in STATE_EXIT.items() if v == 0] == ["ready"]
    assert all(v not in (1, 2, 3, 4, 124) for v in STATE_EXIT.values())  # the client's own codes stay apart
    assert state_exit("nonsense") == 1


@pytest.mark.parametrize(
    ("now", "moved", "code"),
    [
        ({"state": "ready", "started_at": BEFORE.started_at}, False, None),  # the old server: not yet restarted
        ({"state": "restarting", "started_at": BEFORE.started_at}, True, None),
        ({"state": "starting", "started_at": NEW}, True, None),
        ({"state": "ready", "started_at": NEW, "pid": 7, "rung": "base"}, True, 0),
        ({"state": "degraded", "started_at": NEW}, True, 5),
        ({"state": "failed", "started_at": NEW, "reason": "ladder exhausted"}, True, 9),
        ({"state": "stopped", "started_at": BEFORE.started_at}, True, 8),  # someone stopped it meanwhile
    ],
)
def test_restart_waits_for_a_new_server(now: dict[str, object], moved: bool, code: int | None) -> None:
    out = settled("restart", BEFORE, now, moved)
    assert (out.code if out else None) == code


def test_a_failed_daemon_before_the_start_is_not_the_outcome_until_it_moved() -> None:
    before = Before(state="failed", started_at=BEFORE.started_at)
    assert settled("start", before, {"state": "failed", "started_at": BEFORE.started_at}, False) is None
    out = settled("start", before, {"state": "failed", "started_at": NEW}, True)
    assert out is not None and out.code == 9


@pytest.mark.parametrize(
    ("stop", "code", "words"),
    [
        (None, 0, "no server was running"),
        ({"survivors": 0, "port_free": True, "gpu_released": "released"}, 0, "verified by NVML"),
        ({"survivors": 0, "port_free": True, "gpu_released": "unverified"}, 0, "unverified"),
        ({"survivors": 0, "port_free": True, "gpu_released": "held"}, 1, "GPU memory is still held"),
        ({"survivors": 2, "port_free": False, "gpu_released": "released"}, 1, "port is still held"),
    ],
)
def test_stop_is_done_when_stopped_and_says_what_the_verification_found(
    stop: dict[str, object] | None, code: int, words: str
) -> None:
    assert settled("stop", BEFORE, {"state": "restarting", "last_stop": stop}, True) is None
    out = settled("stop", BEFORE, {"state": "stopped", "last_stop": stop}, True)
    assert out is not None and out.code == code and words in out.message


def test_ready_on_a_fallback_rung_is_its_own_exit_code() -> None:
    from supervisor.client.wait import status_exit
    from supervisor.common.exitcodes import EXIT_DEGRADED, EXIT_FALLBACK

    assert status_exit({"state": "ready", "rung_index": 0}) == 0
    assert status_exit({"state": "ready", "rung_index": 2}) == EXIT_FALLBACK == 10
    assert status_exit({"state": "degraded", "rung_index": 1}) == EXIT_DEGRADED  # the worse condition wins
    assert status_exit({"state": "failed", "rung_index": 1}) == 9
    assert status_exit({"state": "ready"}) == 0


def test_a_promote_waits_for_a_new_server_and_says_when_the_preferred_rung_failed() -> None:
    """`promote --wait` (issue 49): done when a new server serves; back on a fallback rung it exits
    10 (`status`'s fallback code) and says the preferred rung failed."""
    assert settled("promote", BEFORE, {"state": "starting", "started_at": NEW, "rung_index": 0}, True) is None
    up = settled("promote", BEFORE, {"state": "ready", "started_at": NEW, "rung": "base", "rung_index": 0}, True)
    assert up is not None and up.code == 0
    back = {"state": "ready", "started_at": NEW, "rung": "no-cuda-graph", "rung_index": 2, "pid": 9}
    out = settled("promote", BEFORE, back, True)
    assert out is not None and out.code == 10 and "the preferred rung failed" in out.message
