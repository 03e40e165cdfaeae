"""`check-config` says which start-up stall window each rung would get on this host, and why: the
configured one for a rung never started here, the learned one per phase once the daemon's book
(`launches.json` in the state directory) has a good start of the same command line."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from supervisor.checkconfig.argcheck import check_rungs, check_rungs_json
from supervisor.config.render import render_rung
from supervisor.config.settings import Settings, settings_from_mapping
from supervisor.policy.learned import Learned
from supervisor.warmstart.timeline import BookEntry, LaunchBook
from supervisor.warmstart.warm import BOOK, host_name, key_for


def settings(tmp_path: Path, **learned: object) -> Settings:
    return settings_from_mapping(
        {
            "server": {"command": [sys.executable], "args": {"model-path": "/models/m"}},
            "fallback": [{"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}],
            "paths": {"state_dir": str(tmp_path / "state")},
            "watchdog": {"startup_stall_s": 180.0},
            "learned": learned,
        }
    )


def taught(s: Settings) -> None:
    """A good start of the base rung on this host, as the daemon's book records it."""
    s.state_dir.mkdir(parents=True, exist_ok=True)
    argv = render_rung(s.server, s.ladder[0]).argv
    book = LaunchBook(s.state_dir / BOOK)
    book.put(BookEntry(key_for(argv, "base", host_name()), Learned(1, {"capturing_graphs": 6.0, "spawning": 1.0})))
    book.save()


def text(s: Settings) -> str:
    out = io.StringIO()
    check_rungs(s, validate=False, out=out, env={"PATH": "/usr/bin:/bin"})
    return out.getvalue()


def test_a_rung_never_started_here_waits_the_configured_window(tmp_path: Path) -> None:
    out = text(settings(tmp_path))
    assert out.count("stall windows: no good start of this model and rung") == 2
    assert "startup_stall_s = 180 s" in out


def test_a_known_rung_gets_its_learned_windows_per_phase_and_the_other_rung_does_not(tmp_path: Path) -> None:
    s = settings(tmp_path)
    taught(s)
    out = text(s)
    assert "stall windows: 1 good start(s)" in out
    assert "capturing_graphs: 30 s (learned: 5 x the longest quiet 6.0 s" in out
    assert "spawning: 20 s (floor:" in out
    assert out.count("no good start of this model and rung") == 1  # no-cuda-graph is another command line
    doc = io.StringIO()
    check_rungs_json(s, validate=False, out=doc, env={"PATH": "/usr/bin:/bin"})
    rungs = json.loads(doc.getvalue())["rungs"]
    assert rungs[0]["stall_windows"]["phases"]["capturing_graphs"]["window_s"] == 30.0
    assert rungs[1]["stall_windows"]["known"] is False


def test_learned_windows_off_and_an_unreadable_book_fall_back_to_the_configured_window(tmp_path: Path) -> None:
    s = settings(tmp_path, enabled=False)
    taught(s)
    assert "learned windows off" in text(s)
    s2 = settings(tmp_path)
    (s2.state_dir / BOOK).write_text("{broken")
    assert text(s2).count("no good start of this model and rung") == 2
