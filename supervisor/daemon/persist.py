"""The ladder's memory across daemon restarts: `state_dir/state.json`, written atomically.

Write to a temporary file in the same directory, every byte of it, fsync it, rename over the old
one, fsync the directory: a crash or a full disk at any point leaves either the old or the new file,
never a torn one. Loading checks every field: a file this daemon did not write (wrong types, huge
numbers, a marker that is empty or holds a NUL) is "malformed, starting afresh", never a crash.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from supervisor.common.atomicfile import atomic_write
from supervisor.common.statefiles import read_regular
from supervisor.daemon.adopt import ServerRecord
from supervisor.policy.ladder import MAX_ATTEMPTS, Attempt, LadderState
from supervisor.status.causes import CAUSES, Cause
from supervisor.status.snapshot import IncidentView

VERSION = 1


@dataclass(frozen=True)
class OpenIncident:
    """An incident whose evidence capture was under way: a daemon killed then records it at start."""

    id: str
    cause: Cause
    rung: str
    at: float  # wall clock


@dataclass(frozen=True)
class Decided:
    """The ladder's decision after an incident, saved before its backoff: a successor (handoff,
    crash) relaunches this rung at `launch_at` instead of the rung that just failed."""

    rung: str
    reason: str
    launch_at: float  # wall clock: the end of the backoff


@dataclass(frozen=True)
class Persisted:
    marker: str  # stable per state directory: finds a tree an earlier daemon left behind
    ladder: LadderState
    rung_names: tuple[str, ...]  # the ladder the indices refer to
    open_incident: OpenIncident | None = None
    server: ServerRecord | None = None  # the running server, for a successor daemon to adopt
    stopped: bool = False  # stopped by request (API, CLI): a restarted daemon does not start it
    decided: Decided | None = None  # a relaunch decided and not yet made (backing off)
    last_incident: IncidentView | None = None  # what `status` shows after a daemon restart


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
        "free_relaunches": p.ladder.free_relaunches,
        "trial_from": (
            p.rung_names[p.ladder.trial_from]
            if p.ladder.trial_from is not None and p.ladder.trial_from < len(p.rung_names)
            else None
        ),
        "consecutive_failures": p.ladder.consecutive_failures,
        "restart_times": list(p.ladder.restart_times),
        "attempts": [asdict(a) for a in p.ladder.attempts],
        "open_incident": asdict(p.open_incident) if p.open_incident is not None else None,
        "server": p.server.to_json() if p.server is not None else None,
        "stopped": p.stopped,
        "decided": asdict(p.decided) if p.decided is not None else None,
        "last_incident": p.last_incident.model_dump() if p.last_incident is not None else None,
    }
    atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode())


def marker_for(state_dir: Path) -> str:
    """The marker of every tree launched for `state_dir`, derived from its resolved path.

    A daemon always has its state directory, so a lost or garbage state.json no longer hides a
    tree (one still starting binds no port, so the port cannot name it either). Two state
    directories never share a marker; the same directory reached through a symlink does.
    """
    return "sd-" + hashlib.sha256(os.fsencode(state_dir.resolve())).hexdigest()[:16]


class Malformed(ValueError):
    """A field of the saved state is not what this daemon writes."""


MAX_COUNT = 1_000_000  # no daemon lives long enough to count more failures than this
MAX_TIMES = 10_000
_MARKER = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def _int(doc: dict[str, Any], key: str) -> int:
    v = doc.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNT:
        raise Malformed(f"{key} must be an integer in [0, {MAX_COUNT}], not {str(v)[:40]!r}")
    return v


def _time(v: object, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v < 1e11:
        raise Malformed(f"{what} must be a Unix time, not {str(v)[:40]!r}")
    return float(v)


def _opt_str(doc: dict[str, Any], key: str) -> str | None:
    v = doc.get(key)
    if v is not None and (not isinstance(v, str) or "\0" in v or len(v) > 200):
        raise Malformed(f"{key} must be a rung name")
    return v


def _attempt(a: object) -> Attempt:
    if not isinstance(a, dict) or set(a) - {f.name for f in fields(Attempt)}:
        raise Malformed("an attempt is not a record of rung, started_at, outcome, hang_class, ended_at")
    rung, outcome, hang = a.get("rung"), a.get("outcome", "running"), a.get("hang_class")
    if not isinstance(rung, str) or not isinstance(outcome, str) or not (hang is None or isinstance(hang, str)):
        raise Malformed("an attempt's rung, outcome or hang_class is not text")
    ended, ready = a.get("ended_at"), a.get("ready_at")
    return Attempt(
        rung=rung[:200],
        started_at=_time(a.get("started_at"), "an attempt's started_at"),
        outcome=outcome[:200],
        hang_class=hang[:200] if hang is not None else None,
        ended_at=_time(ended, "an attempt's ended_at") if ended is not None else None,
        ready_at=_time(ready, "an attempt's ready_at") if ready is not None else None,
    )


def parse(doc: object, rung_names: tuple[str, ...]) -> Persisted:
    """The saved document, checked field by field; Malformed names the first field that is wrong."""
    if not isinstance(doc, dict):
        raise Malformed("not a JSON object")
    marker = doc.get("marker")
    if not isinstance(marker, str) or not _MARKER.fullmatch(marker):
        raise Malformed("marker must be 1-128 letters, digits, '_', '.' or '-'")
    times_raw = doc.get("restart_times", [])
    attempts_raw = doc.get("attempts", [])
    if not isinstance(times_raw, list) or len(times_raw) > MAX_TIMES:
        raise Malformed("restart_times must be a list of Unix times")
    if not isinstance(attempts_raw, list) or len(attempts_raw) > MAX_TIMES:
        raise Malformed("attempts must be a list")
    index = {n: i for i, n in enumerate(rung_names)}
    current_name, last_good_name = _opt_str(doc, "current"), _opt_str(doc, "last_good")
    trial_name = _opt_str(doc, "trial_from")
    current = index.get(current_name) if current_name is not None else None
    failures = _int(doc, "failures_on_current")
    ladder = LadderState(
        current=current if current is not None else 0,
        failures_on_current=failures if current is not None else 0,
        consecutive_failures=_int(doc, "consecutive_failures"),
        last_good=index.get(last_good_name) if last_good_name is not None else None,
        trial_from=index.get(trial_name) if trial_name is not None else None,
        free_relaunches=min(_int(doc, "free_relaunches"), 1),
        restart_times=tuple(_time(t, "a restart time") for t in times_raw),
        attempts=tuple(_attempt(a) for a in attempts_raw)[-MAX_ATTEMPTS:],
    )
    # A server record that is not exactly what this daemon writes is not adopted (the tree is then
    # stopped by marker), but it does not cost the ladder its memory.
    server = ServerRecord.from_json(doc.get("server"))
    stopped = doc.get("stopped", False)
    if not isinstance(stopped, bool):
        raise Malformed("stopped must be true or false")
    return Persisted(
        marker=marker,
        ladder=ladder,
        rung_names=rung_names,
        open_incident=_open(doc.get("open_incident")),
        server=server,
        stopped=stopped,
        decided=_decided(doc.get("decided")),
        last_incident=_incident(doc.get("last_incident")),
    )


def _decided(v: object) -> Decided | None:
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) != {f.name for f in fields(Decided)}:
        raise Malformed("decided must be a record of rung, reason, launch_at")
    if not all(isinstance(t, str) and 0 < len(t) <= 1000 and "\0" not in t for t in (v["rung"], v["reason"])):
        raise Malformed("decided's rung and reason must be short text")
    return Decided(rung=v["rung"], reason=v["reason"], launch_at=_time(v["launch_at"], "decided.launch_at"))


def _incident(v: object) -> IncidentView | None:
    """The last incident as saved; one that is not what this daemon writes is dropped, not fatal."""
    if not isinstance(v, dict):
        return None
    try:
        return IncidentView.model_validate(v)
    except ValueError:
        return None


def _open(v: object) -> OpenIncident | None:
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) != {f.name for f in fields(OpenIncident)}:
        raise Malformed("open_incident must be a record of id, cause, rung, at")
    texts = [v["id"], v["cause"], v["rung"]]
    if not all(isinstance(t, str) and 0 < len(t) <= 200 and "\0" not in t for t in texts):
        raise Malformed("open_incident's id, cause and rung must be short text")
    cause = v["cause"]
    if cause not in CAUSES:
        raise Malformed(f"open_incident's cause {cause!r} is none of {', '.join(CAUSES)}")
    return OpenIncident(id=v["id"], cause=cause, rung=v["rung"], at=_time(v["at"], "open_incident.at"))


def load(path: Path, rung_names: tuple[str, ...]) -> tuple[Persisted | None, str]:
    """The saved state mapped onto the current ladder (rungs matched by name), or None and why."""
    try:
        doc = json.loads(read_regular(path))  # no FIFO, link or device (issue 50)
    except FileNotFoundError:
        return None, "no saved state"
    except (OSError, ValueError, RecursionError) as err:
        return None, f"saved state unreadable ({str(err)[:200]}); starting afresh"
    try:
        return parse(doc, rung_names), "resumed saved state"
    except Malformed as err:
        return None, f"saved state malformed ({err}); starting afresh"


@dataclass
class InHand:
    """The incident and decisions in hand: what is being captured, what the ladder decided, which
    commands are queued that a second one must not repeat."""

    last_incident: IncidentView | None = None
    open_incident: OpenIncident | None = None  # persisted while its capture runs
    decided: Decided | None = None  # persisted from the ladder's decision until the launch
    diagnosing: bool = False
    restart_pending: bool = False
    resume_after_error: bool = False  # a restart was cut short by an exception: finish it
    incident_ids: list[str] = field(default_factory=list)  # recent ids, so two in one second differ


def why_not_adopted(saved: Persisted | None, why: str) -> str:
    """Why a start sweeps what carries the marker instead of adopting it (`leftovers_stopped.reason`):
    the journal must say why a server that was serving is reloaded. `why`: how state.json loaded."""
    if saved is None:
        return f"no server record to adopt it by ({why})"
    if saved.open_incident is not None:  # the predecessor had judged this server: its verdict stands
        return f"incident {saved.open_incident.id} ({saved.open_incident.cause}) was under way"
    if saved.server is None:
        return "state.json records no running server (its predecessor was stopping or launching it)"
    return "its server record did not prove it ours (see adoption_refused)"
