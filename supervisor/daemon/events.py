"""The owner's events, recorded once: supervisord's `events.subscribe`/`notify` for this daemon.

The owner reports an event only through `Owner.record(name, level, **fields)`, which notifies
this bus; the channels subscribe: the journal file (`events.jsonl`, and through its listeners the
alerter), the structlog line (with the launch's bound rung and pid), and the Prometheus counters
that an event implies (`counting_subscriptions`). An event names where it goes when it is not
everywhere (`only`): some are journal lines without a log line of their own (a log line of another
shape says the same, or none does), some log lines are not journalled; DESIGN.md and the tests pin
both, so the split is kept as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import structlog

from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.status.eventnames import AnyEventName, journal_name
from supervisor.status.journal import Journal
from supervisor.status.notifytally import NotifyTally

Channel = Literal["journal", "log"]
CHANNELS: tuple[Channel | None, ...] = (None, "journal", "log")  # None: every channel


@dataclass(frozen=True)
class Event:
    name: AnyEventName
    level: str  # the log line's: info, warning, error, exception
    fields: Mapping[str, object]
    only: Channel | None = None  # None: every channel

    def goes_to(self, channel: Channel) -> bool:
        return self.only is None or self.only == channel


Listener = Callable[[Event], None]


class EventBus:
    """Listeners for every event, or for one name; `notify` calls them in the order they subscribed."""

    def __init__(self) -> None:
        self._every: list[Listener] = []
        self._by_name: dict[str, list[Listener]] = {}

    def subscribe(self, listener: Listener, name: str | None = None) -> None:
        if name is None:
            self._every.append(listener)
        else:
            self._by_name.setdefault(name, []).append(listener)

    def notify(self, event: Event) -> None:
        for listener in (*self._every, *self._by_name.get(event.name, ())):
            listener(event)


def _incident(m: SupervisorMetrics) -> Listener:
    def count(e: Event) -> None:
        if e.goes_to("journal"):  # the journal's incident line, once per incident
            m.incident(str(e.fields["cause"]), str(e.fields.get("hang_class") or "none"))

    return count


def _spec_regression(m: SupervisorMetrics) -> Listener:
    return lambda e: m.incident("spec_regression", "none")


def _gpu_xid(m: SupervisorMetrics) -> Listener:
    def count(e: Event) -> None:
        f = e.fields
        m.xid(cast(int, f["gpu"]), str(f["uuid"]), cast(int, f["xid"]), str(f["action"]))

    return count


def _ready(m: SupervisorMetrics) -> Listener:
    def count(e: Event) -> None:
        f = e.fields
        if f.get("adopted"):
            m.takeover(cast(float, f["takeover_s"]))
        elif f.get("time_to_ready_s") is not None:
            m.ready(cast(float, f["time_to_ready_s"]))

    return count


def _launch_timeline(m: SupervisorMetrics) -> Listener:
    def count(e: Event) -> None:
        phases = e.fields.get("phases")
        if isinstance(phases, dict):
            for phase, seconds in phases.items():
                if isinstance(seconds, (int, float)):
                    m.launch_phase(str(phase), float(seconds))

    return count


def _outage(m: SupervisorMetrics) -> Listener:
    def count(e: Event) -> None:
        f = e.fields
        parts = f.get("parts")
        if isinstance(parts, dict):
            for part, seconds in parts.items():
                if isinstance(seconds, (int, float)):
                    m.outage(str(part), float(seconds))
        for part, name in (("total", "total_s"), ("daemon", "daemon_s")):
            value = f.get(name)
            if isinstance(value, (int, float)):
                m.outage(part, float(value))

    return count


def counting_subscriptions(m: SupervisorMetrics) -> Mapping[str, Listener]:
    """The counters an event implies, by event name (the rest are fed by what no event carries:
    a probe's latency, an exception's type, a refusal's kind, a capture's exact duration)."""
    return {
        "incident": _incident(m),
        "spec_regression": _spec_regression(m),
        "gpu_xid": _gpu_xid(m),
        "log_keeper_replaced": lambda e: m.keeper_replaced(),
        "server_ready": _ready(m),
        "launch_timeline": _launch_timeline(m),
        "outage": _outage(m),
        "diagnostics_failed": lambda e: m.diagnostic(0.0, "error") if e.goes_to("journal") else None,
    }


JournalListener = Callable[[dict[str, object]], None]


class Recorder:
    """The one way the daemon reports an event (STYLE: bind context once, record each event once):
    `record` notifies the bus, and the journal line, the log line (with the launch's bound rung and
    pid) and the counters it implies are its subscribers. The journal's own listeners (the alerter,
    the notification tally) hear each line as written."""

    def __init__(self, state_dir: Path, metrics: SupervisorMetrics) -> None:
        self.journal = Journal(state_dir / "events.jsonl")
        self.notify_tally = NotifyTally()  # notification outcomes for `status` and the page
        self.journal.listeners.append(self.notify_tally.feed)
        self.log: Any = structlog.get_logger("supervisor.daemon.owner")  # rebound per launch
        self.bus = EventBus()
        self.bus.subscribe(self._journal_line)
        self.bus.subscribe(self._log_line)
        for name, count in counting_subscriptions(metrics).items():
            self.bus.subscribe(count, name)

    def record(self, event: AnyEventName, level: str = "info", /, *, only: Any = None, **fields: Any) -> None:
        """`only` ("journal" or "log") names the one channel of an event that has no line in the
        other. (`only` is typed Any so that `**fields` of any value type still binds past it.)"""
        if only not in CHANNELS:
            raise ValueError(f"record({event!r}): only={only!r} is not one of {CHANNELS}")
        channel: Channel | None = only
        self.bus.notify(Event(event, level, fields, channel))

    def bind(self, **context: object) -> None:
        """Context every later log line carries (a launch's rung and pid, an incident's id)."""
        self.log = self.log.bind(**context)

    def unbind(self, *keys: str) -> None:
        self.log = self.log.try_unbind(*keys)

    def rebind(self, **context: object) -> None:
        """A new launch or adoption: only its own context from here on."""
        self.log = structlog.get_logger("supervisor.daemon.owner").bind(**context)

    def subscribe_journal(self, listener: JournalListener) -> None:
        """Hear every journal line as written (with its time): the alerter."""
        self.journal.listeners.append(listener)

    def unsubscribe_journal(self, listener: JournalListener) -> None:
        self.journal.listeners.remove(listener)

    def _journal_line(self, e: Event) -> None:
        if e.goes_to("journal"):
            self.journal.append(journal_name(e.name), **e.fields)

    def _log_line(self, e: Event) -> None:
        if e.goes_to("log"):
            getattr(self.log, e.level)(e.name, **e.fields)
