"""state.json: written whole or not at all, and every field checked when loaded."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from supervisor.common.atomicfile import atomic_write
from supervisor.daemon import persist
from supervisor.daemon.persist import Persisted, load, save
from supervisor.policy.ladder import Attempt, LadderState

NAMES = ("base", "no-cuda-graph")


def good() -> dict[str, Any]:
    return {
        "version": 1,
        "marker": "0123456789abcdef",
        "rungs": list(NAMES),
        "current": "no-cuda-graph",
        "last_good": "base",
        "failures_on_current": 1,
        "consecutive_failures": 2,
        "restart_times": [1_700_000_000.5],
        "attempts": [{"rung": "base", "started_at": 1_700_000_000.0, "outcome": "exited", "ended_at": 1.7e9}],
    }


def test_round_trip(tmp_path: Path) -> None:
    st = LadderState(current=1, failures_on_current=1, last_good=0, attempts=(Attempt("base", 1.7e9),))
    save(tmp_path / "state.json", Persisted("abc123", st, NAMES))
    p, why = load(tmp_path / "state.json", NAMES)
    assert p is not None and why == "resumed saved state" and p.ladder == st and p.marker == "abc123"


@pytest.mark.parametrize(
    "change",
    [
        {"marker": ""},
        {"marker": "abc\0def"},
        {"marker": 12},
        {"consecutive_failures": "3"},
        {"consecutive_failures": 10**30},
        {"consecutive_failures": -1},
        {"failures_on_current": True},
        {"restart_times": [1e308]},
        {"restart_times": "now"},
        {"attempts": [{"rung": "base", "started_at": "yesterday"}]},
        {"attempts": [{"rung": "base", "started_at": 1.0, "evil": 1}]},
        {"current": ["base"]},
    ],
)
def test_malformed_fields_start_afresh(tmp_path: Path, change: dict[str, Any]) -> None:
    (tmp_path / "state.json").write_text(json.dumps({**good(), **change}))
    p, why = load(tmp_path / "state.json", NAMES)
    assert p is None and why.startswith("saved state malformed"), why


def test_unreadable_and_torn_files_start_afresh(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(json.dumps(good()).encode()[:40])
    assert load(path, NAMES)[0] is None
    path.write_bytes(b"[" * 100_000)
    assert load(path, NAMES)[0] is None
    assert load(tmp_path / "absent.json", NAMES) == (None, "no saved state")


def test_a_big_but_sane_failure_count_loads(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({**good(), "consecutive_failures": 1100}))
    p, _ = load(tmp_path / "state.json", NAMES)
    assert p is not None and p.ladder.consecutive_failures == 1100


def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write
    monkeypatch.setattr(persist.os, "write", lambda fd, data: real(fd, bytes(data[:7])))
    atomic_write(tmp_path / "f", b"x" * 10_000)
    assert (tmp_path / "f").read_bytes() == b"x" * 10_000


def test_a_write_that_fails_keeps_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")
    real = os.write
    calls = []

    def nearly_full(fd: int, data: Any) -> int:
        calls.append(1)
        if len(calls) == 1:
            return real(fd, bytes(data[:4096]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(persist.os, "write", nearly_full)
    with pytest.raises(OSError):
        atomic_write(path, b"y" * 10_000)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_the_ladders_decision_round_trips_and_garbage_in_it_starts_afresh(tmp_path: Path) -> None:
    from supervisor.daemon.persist import Decided

    path = tmp_path / "state.json"
    names = ("base", "no-cuda-graph")
    decided = Decided("no-cuda-graph", "stepping down after startup_stall", 1_700_000_030.0)
    save(path, Persisted("m1", LadderState(current=0), names, decided=decided))
    loaded, _ = load(path, names)
    assert loaded is not None and loaded.decided == decided
    for bad in (
        {"rung": 3, "reason": "x", "launch_at": 1.0},
        {"rung": "a"},
        "no-cuda-graph",
        {"rung": "a", "reason": "x", "launch_at": -1},
    ):
        doc = json.loads(path.read_text())
        doc["decided"] = bad
        path.write_text(json.dumps(doc))
        again, why = load(path, names)
        assert again is None and "decided" in why


def test_the_marker_is_derived_from_the_resolved_state_dir(tmp_path: Path) -> None:
    from supervisor.daemon.persist import _MARKER, marker_for

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (tmp_path / "link").symlink_to(a)
    assert marker_for(a) == marker_for(tmp_path / "link") == marker_for(tmp_path / "x" / ".." / "a")
    assert marker_for(a) != marker_for(b)
    assert _MARKER.fullmatch(marker_for(a))  # what state.json accepts
def test_the_last_incident_survives_and_a_bad_one_costs_nothing_else(tmp_path: Path) -> None:
    from supervisor.status.snapshot import IncidentView

    inc = IncidentView(id="i1", cause="serving_stall", at="2026-12-01T00:00:00+00:00", rung="base", detail="no tokens")
    save(tmp_path / "state.json", Persisted("abc123", LadderState(), NAMES, last_incident=inc))
    p, _ = load(tmp_path / "state.json", NAMES)
    assert p is not None and p.last_incident == inc
    (tmp_path / "state.json").write_text(json.dumps({**good(), "last_incident": {"id": 3, "evil": True}}))
    p, why = load(tmp_path / "state.json", NAMES)
    assert p is not None and p.last_incident is None and p.ladder.current == 1, why
