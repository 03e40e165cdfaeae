"""What the daemon leaves in its state directory, as a test reads it: the event journal
(`events.jsonl`) and the server's log files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def events(state_dir: str | Path) -> list[dict[str, Any]]:
    """The journal's events, oldest first; none before the daemon wrote its first."""
    path = Path(state_dir) / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(x) for x in lines if x.strip()]


def named(state_dir: str | Path, name: str) -> list[dict[str, Any]]:
    """The journal's events called `name`, oldest first."""
    return [e for e in events(state_dir) if e["event"] == name]


def server_log(state_dir: str | Path) -> str:
    """Every server log file, the rotated ones first: the server's output as it came."""
    files = sorted((Path(state_dir) / "logs").glob("server.log*"), reverse=True)  # oldest first
    return "".join(f.read_text(errors="replace") for f in files)
