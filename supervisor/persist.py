"""The ladder's memory across daemon restarts: `state_dir/state.json`, written atomically.

Write to a temporary file in the same directory, fsync it, rename over the old one, fsync the
directory: a crash at any point leaves either the old or the new file, never a torn one.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from supervisor.adopt import ServerRecord
from supervisor.ladder import Attempt, LadderState

VERSION = 1


@dataclass(frozen=True)
class Persisted:
    marker: str  # stable per state directory: finds a tree an earlier daemon left behind
    ladder: LadderState
    rung_names: tuple[str, ...]  # the ladder the indices refer to
    server: ServerRecord | None = None  # the running server, for a successor daemon to adopt


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def save(path: Path, p: Persisted) -> None:
    doc = {
        "version": VERSION,
        "marker": p.marker,
        "rungs": list(p.rung_names),
        "current": p.rung_names[p.ladder.current] if p.ladder.current < len(p.rung_names) else None,
        "last_good": (
            p.rung_names[p.ladder.last_good]
            if p.ladder.last_good is not None and p.ladder.last_good < len(p.rung_names)
            else None
        ),
        "failures_on_current": p.ladder.failures_on_current,
        "consecutive_failures": p.ladder.consecutive_failures,
        "restart_times": list(p.ladder.restart_times),
        "attempts": [asdict(a) for a in p.ladder.attempts],
        "server": p.server.to_json() if p.server is not None else None,
    }
    atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode())


def new_marker() -> str:
    return secrets.token_hex(8)


def load(path: Path, rung_names: tuple[str, ...]) -> tuple[Persisted | None, str]:
    """The saved state mapped onto the current ladder (rungs matched by name), or None and why."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None, "no saved state"
    except (OSError, ValueError) as err:
        return None, f"saved state unreadable ({err}); starting afresh"
    if not isinstance(doc, dict) or not isinstance(doc.get("marker"), str):
        return None, "saved state malformed; starting afresh"
    index = {n: i for i, n in enumerate(rung_names)}

    def idx(name: object) -> int | None:
        return index.get(name) if isinstance(name, str) else None

    attempts: list[Attempt] = []
    for a in doc.get("attempts", []) if isinstance(doc.get("attempts"), list) else []:
        try:
            attempts.append(Attempt(**a))
        except TypeError:
            continue
    times = tuple(float(t) for t in doc.get("restart_times", []) if isinstance(t, (int, float)))
    current = idx(doc.get("current"))
    ladder = LadderState(
        current=current if current is not None else 0,
        failures_on_current=int(doc.get("failures_on_current", 0)) if current is not None else 0,
        consecutive_failures=int(doc.get("consecutive_failures", 0)),
        last_good=idx(doc.get("last_good")),
        restart_times=times,
        attempts=tuple(attempts),
    )
    server = ServerRecord.from_json(doc.get("server"))
    return Persisted(marker=doc["marker"], ladder=ladder, rung_names=rung_names, server=server), "resumed saved state"
