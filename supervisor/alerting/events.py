"""What is worth telling someone, decided from the journal's records (pure: no I/O, no clock).

The journal already records each thing once, as it happens; reading notifications off it keeps
what is sent and what is journalled the same story. The four events:

- `incident`: the watchdog (or a crash) opened an incident; sent once its evidence is captured, with
  the cause, hang class and bundle id. An operator's own `restart` (cause `manual`) is not one.
- `failed`: the ladder or the restart budget is spent (state `failed`); the server stays down
  until `failed_cooldown_s` passes or someone acts.
- `recovered`: the first `ready` after an incident or `failed`, naming the incident that opened
  the episode with that incident's own cause and class (never one incident's id with another's
  cause), how many incidents followed it and the last of them, the rung it serves on now and
  whether that is the preferred rung or a fallback.
- `stayed_stopped`: the daemon (re)started and left the server stopped, because an operator had
  stopped it before the daemon restarted. A heads-up that nothing is serving, by design.
- `launch_blocked`: launches have been refused in a row until the refused-launch backoff reached
  its cap (processes outside the server hold the GPU memory the rung needs, named with the
  numbers); the daemon keeps trying, and the `ready` that ends it is a `recovered`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from supervisor.config.alerting import EventKind


@dataclass(frozen=True)
class Opened:
    """One incident as the journal recorded it: its id, cause and class belong together."""

    id: str | None
    cause: str | None
    hang_class: str | None = None
    bundle: str | None = None

    def words(self) -> str:
        cls = f", {self.hang_class}" if self.hang_class else ""
        what = f" ({self.cause}{cls})" if self.cause else ""
        return f"{self.id or 'the incident'}{what}" if self.id else (self.cause or "")


@dataclass(frozen=True)
class NotifyEvent:
    kind: EventKind
    at: str  # ISO 8601 UTC, the journal record's time
    instance: str  # which server of which host: "host:port"
    rung: str = ""
    reason: str = ""
    incident_id: str | None = None
    cause: str | None = None
    hang_class: str | None = None
    bundle: str | None = None
    culprit: str | None = None  # the bundle's culprit line (issue 35)
    # `recovered` only: the preferred rung (rung 0) and whether `rung` is it; the episode's
    # incidents after the first (how many, and the last of them, with its own cause and class).
    preferred_rung: str | None = None
    on_preferred: bool | None = None
    later_incidents: int = 0
    last_incident: Opened | None = None

    @property
    def summary(self) -> str:
        """One line a person reads on a phone at 3 am."""
        where = f"SGLang {self.instance}"
        if self.kind == "incident":
            cls = f", {self.hang_class}" if self.hang_class else ""
            text = f"{where}: incident {self.cause}{cls} on rung {self.rung or '?'}"
            if self.reason:
                text += f": {self.reason}"
            if self.culprit:
                text += f"; {self.culprit}"
            if self.bundle:
                text += f" (evidence {self.bundle})"
            return text
        if self.kind == "failed":
            return f"{where}: FAILED, not serving: {self.reason or 'the ladder is spent'}"
        if self.kind == "recovered":
            first = Opened(self.incident_id, self.cause, self.hang_class).words()
            after = f" after {first}" if self.incident_id else (f" out of {first}" if first else "")
            if self.later_incidents and self.last_incident is not None:
                more = "1 more incident" if self.later_incidents == 1 else f"{self.later_incidents} more incidents"
                after += f" and {more}, the last {self.last_incident.words()}"
            text = f"{where}: recovered{after}, serving on rung {self.rung or '?'}"
            if self.on_preferred is True:
                return text + " (the preferred rung)"
            if self.on_preferred is False:
                return text + f" (a fallback, not the preferred rung {self.preferred_rung}: `promote` tries it again)"
            return text
        if self.kind == "launch_blocked":
            return f"{where}: not launching rung {self.rung or '?'}, still waiting: {self.reason}"
        return f"{where}: stayed stopped after the daemon restarted: {self.reason or 'stopped by request'}"


@dataclass
class Tracker:
    """Turns journal records into events; remembers the episode a `recovered` will name."""

    instance: str
    # The preferred rung's name, asked when a `recovered` is told (a reload may change the ladder).
    preferred: Callable[[], str | None] = field(default=lambda: None)
    open_incident: str | None = None  # the incident (or "failed") not yet followed by ready
    rung: str = ""
    first: Opened | None = None  # the incident that opened the episode
    last: Opened | None = None  # the newest incident of the episode
    later: int = 0  # incidents of the episode after the first

    def feed(self, record: dict[str, object]) -> NotifyEvent | None:
        name = record.get("event")
        at = str(record.get("ts", ""))
        rung = _text(record.get("rung"))
        if rung:
            self.rung = rung
        if name == "incident" and record.get("cause") != "manual":
            inc = _text(record.get("id")) or None
            this = Opened(
                inc,
                _text(record.get("cause")) or None,
                _text(record.get("hang_class")) or None,
                _text(record.get("bundle")) or None,
            )
            if self.first is None:
                self.first = this
            else:
                self.later += 1
            self.last = this
            self.open_incident = inc or self.open_incident or "incident"
            return NotifyEvent(
                kind="incident",
                at=at,
                instance=self.instance,
                rung=rung,
                reason=_text(record.get("detail"))[:500],
                incident_id=inc,
                cause=this.cause,
                hang_class=this.hang_class,
                bundle=this.bundle,
                culprit=_text(record.get("culprit"))[:300] or None,
            )
        if name == "state_changed" and record.get("new") == "failed" and record.get("old") != "failed":
            return self._opening("failed", "failed", at, rung, record)
        if name == "server_ready" and self.open_incident is not None:
            marker = self.open_incident if self.open_incident in ("failed", "blocked") else None
            first = self.first or Opened(None, marker)
            later, last = self.later, self.last
            self.open_incident, self.first, self.last, self.later = None, None, None, 0
            preferred = self.preferred()
            return NotifyEvent(
                kind="recovered",
                at=at,
                instance=self.instance,
                rung=rung,
                incident_id=first.id,
                cause=first.cause,
                hang_class=first.hang_class,
                bundle=first.bundle,
                preferred_rung=preferred,
                on_preferred=None if not preferred or not rung else rung == preferred,
                later_incidents=later,
                last_incident=last if later else None,
            )
        if name == "launch_blocked":
            return self._opening("launch_blocked", "blocked", at, rung, record)
        if name == "stayed_stopped":
            return NotifyEvent(
                kind="stayed_stopped", at=at, instance=self.instance, rung=self.rung, reason=_text(record.get("reason"))
            )
        return None

    def _opening(self, kind: EventKind, marker: str, at: str, rung: str, record: dict[str, object]) -> NotifyEvent:
        """`failed` or `launch_blocked`: opens an episode (`marker`, unless an incident is open
        already) that the next `ready` ends as `recovered`; names the incident it belongs to."""
        if self.open_incident is None:
            self.open_incident = marker
        return NotifyEvent(
            kind=kind,
            at=at,
            instance=self.instance,
            rung=rung,
            reason=_text(record.get("reason"))[:500],
            incident_id=self._incident_or_none(),
        )

    def _incident_or_none(self) -> str | None:
        return self.open_incident if self.open_incident not in (None, "failed", "incident", "blocked") else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))
