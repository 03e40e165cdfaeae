"""`check-config`: which start-up stall window each rung would get on this host, and why (issue 36).

Read-only: the state directory's `launches.json` (what good starts taught), never written here. A
missing or unreadable book means no rung is known: every phase waits `startup_stall_s`.
"""

from __future__ import annotations

from supervisor.config.render import render_rung
from supervisor.config.settings import Rung, Settings
from supervisor.policy.learned import window_for
from supervisor.warmstart.timeline import LaunchBook
from supervisor.warmstart.warm import BOOK, host_name, key_for


def rung_windows(settings: Settings, rung: Rung, book: LaunchBook, host: str) -> dict[str, object]:
    """{"known": bool, "starts": n, "why": ..., "phases": {phase: {"window_s", "source", "why"}}}."""
    configured = settings.watchdog.startup_stall_s
    argv = render_rung(settings.server, rung).argv
    entry = book.get(key_for(argv, rung.name, host))
    if not settings.learned.enabled:
        return {"known": False, "starts": 0, "why": settings.learned.describe(configured), "phases": {}}
    if entry is None:
        why = f"no good start of this model and rung on {host} yet: every phase waits startup_stall_s = {configured:g}"
        why += " s"
        return {"known": False, "starts": 0, "why": why, "phases": {}}
    phases: dict[str, object] = {}
    for phase in entry.learned.quiet_s:
        w = window_for(entry.learned, phase, configured, settings.learned)
        phases[phase] = {"window_s": round(w.window_s, 1), "source": w.source, "why": w.why}
    why = f"{entry.learned.starts} good start(s) on {host}; a phase not listed waits {configured:g} s"
    return {"known": True, "starts": entry.learned.starts, "why": why, "phases": phases}


def all_windows(settings: Settings) -> dict[str, dict[str, object]]:
    book = LaunchBook(settings.state_dir / BOOK).load()
    host = host_name()
    return {r.name: rung_windows(settings, r, book, host) for r in settings.ladder}


def window_lines(doc: dict[str, object]) -> list[str]:
    lines = [f"  stall windows: {doc['why']}"]
    phases = doc.get("phases")
    if isinstance(phases, dict):
        for phase, w in phases.items():
            if isinstance(w, dict):
                lines.append(f"    {phase}: {w['window_s']:g} s ({w['source']}: {w['why']})")
    return lines
