"""The journal's event names are the daemon's: mypy checks that every name written is listed
(`Journal.append` and the owner's `record` take an `EventName`); this checks the other way, which a
type checker cannot: every name listed is written somewhere, so `GET /events?event=` lists no name
that never appears."""

from __future__ import annotations

import ast
from pathlib import Path

from supervisor.status.eventnames import EVENT_NAMES, unknown_events

ROOT = Path(__file__).resolve().parents[3]
LIST = ROOT / "supervisor" / "status" / "eventnames.py"


def string_constants() -> set[str]:
    """Every string literal of the product's sources, but the list itself."""
    found: set[str] = set()
    for path in [*ROOT.glob("supervisor/**/*.py"), *ROOT.glob("api/**/*.py")]:
        if path == LIST:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


def test_every_listed_name_is_written_somewhere() -> None:
    assert sorted(EVENT_NAMES - string_constants()) == [], "listed in supervisor/status/eventnames.py but never written"


def test_unknown_names_are_the_ones_not_listed() -> None:
    assert unknown_events({"incident", "incidents", "state_change"}) == ["incidents", "state_change"]
    assert unknown_events(set()) == []
