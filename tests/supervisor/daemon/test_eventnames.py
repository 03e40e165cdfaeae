"""The list of journal event names is the daemon's: every name written is listed, every name listed is written."""

from __future__ import annotations

import re
from pathlib import Path

from supervisor.daemon.eventnames import EVENT_NAMES, unknown_events

ROOT = Path(__file__).resolve().parents[3]
# The journal is written by `journal.append("<event>", ...)` or by the owner's `record("<event>", ...)`
# (journal and log line together); helpers hand the owner `Note("<event>", ...)` to record.
WRITE = re.compile(r"(?:journal\.append|\brecord|\bNote)\(\s*\"([a-z_]+)\"")
# The owner's leave_failed("<event>", ...) passes the event name through.
LEAVE = re.compile(r"leave_failed\(\s*\"([a-z_]+)\"")
# A module that journals one event under a constant (supervisor/alerting/dispatch.py) names it once.
CONSTANT = re.compile(r"^JOURNAL_EVENT = \"([a-z_]+)\"", re.M)
# The owner's record("<line>", ..., only="log", ...) is a log line with no journal line: not an event name.
LOG_ONLY = re.compile(r"\brecord\(\s*\"[a-z_]+\"\s*,(?:\s*[\w\"]+\s*,)?\s*only=\"log\"")
BRANCH = re.compile(r"(?:journal\.append|\brecord)\(\s*\"([a-z_]+)\"\s+if\s+[^\n]+?\s+else\s+\"([a-z_]+)\"")


def written() -> set[str]:
    names: set[str] = set()
    for path in [*ROOT.glob("supervisor/**/*.py"), *ROOT.glob("api/**/*.py")]:
        text = LOG_ONLY.sub("", path.read_text())
        names.update(WRITE.findall(text))
        names.update(LEAVE.findall(text))
        names.update(CONSTANT.findall(text))
        for a, b in BRANCH.findall(text):
            names.update((a, b))
    return names


def test_every_name_the_daemon_writes_is_known_and_every_known_name_is_written() -> None:
    names = written()
    assert names, "no journal writes found: the pattern no longer matches the code"
    assert sorted(names - EVENT_NAMES) == [], "add these to supervisor/daemon/eventnames.py"
    assert sorted(EVENT_NAMES - names) == [], "these are listed but never written"


def test_unknown_names_are_the_ones_not_listed() -> None:
    assert unknown_events({"incident", "incidents", "state_change"}) == ["incidents", "state_change"]
    assert unknown_events(set()) == []
