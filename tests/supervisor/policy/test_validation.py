"""The one validation of commands (supervisor.policy.validation.check), as a table over the state."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config.settings import Settings, settings_from_mapping
from supervisor.policy.lifecycle import State
from supervisor.policy.validation import check
from supervisor.status.commands import Command, CommandKind


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return settings_from_mapping(
        {
            "server": {"command": ["sglang-server"]},
            "fallback": [{"name": "no-graph", "args": {"disable-cuda-graph": True}}],
            "paths": {"state_dir": str(tmp_path)},
        }
    )


def outcome(settings: Settings, kind: CommandKind, state: State, *, queued: bool, rung: str | None = None,
            restart_pending: bool = False, diagnosing: bool = False) -> str | None:  # fmt: skip
    r = check(
        Command(kind=kind, rung=rung),
        state=state,
        settings=settings,
        restart_pending=restart_pending,
        diagnosing=diagnosing,
        queued=queued,
    )
    return None if r is None else r.outcome


@pytest.mark.parametrize("queued", [False, True])
def test_what_the_state_makes_meaningless_is_refused_at_submit_and_in_the_queue(
    settings: Settings, queued: bool
) -> None:
    assert outcome(settings, "restart", State.READY, queued=queued, rung="nope") == "invalid"
    assert outcome(settings, "restart", State.READY, queued=queued, rung="no-graph") is None
    assert outcome(settings, "diagnose", State.STOPPED, queued=queued) == "invalid"
    assert outcome(settings, "diagnose", State.HUNG, queued=queued) is None
    assert outcome(settings, "start", State.STARTING, queued=queued) == "done"  # idempotent (issue 53)
    assert outcome(settings, "start", State.READY, queued=queued) == "done"
    assert outcome(settings, "start", State.READY, queued=queued, rung="no-graph") == "conflict"
    assert outcome(settings, "start", State.RESTARTING, queued=queued) is None  # a start skips a backoff
    assert outcome(settings, "start", State.FAILED, queued=queued) is None
    assert outcome(settings, "stop", State.STOPPED, queued=queued) == "done"
    assert outcome(settings, "stop", State.RESTARTING, queued=queued) is None  # a stop ends a backoff
    for kind in ("reload", "shutdown", "handoff"):
        assert outcome(settings, kind, State.DIAGNOSING, queued=queued) is None  # type: ignore[arg-type]


def test_a_second_restart_or_capture_is_refused_at_submit_not_in_the_queue(settings: Settings) -> None:
    for state in (State.HUNG, State.DIAGNOSING, State.RESTARTING):
        assert outcome(settings, "restart", state, queued=False) == "conflict"
        assert outcome(settings, "restart", state, queued=True) is None
    assert outcome(settings, "restart", State.READY, queued=False, restart_pending=True) == "conflict"
    assert outcome(settings, "restart", State.READY, queued=True, restart_pending=True) is None
    assert outcome(settings, "diagnose", State.READY, queued=False, diagnosing=True) == "busy"
    assert outcome(settings, "diagnose", State.READY, queued=True, diagnosing=True) is None
