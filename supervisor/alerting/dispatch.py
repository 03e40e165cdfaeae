"""Delivering notifications without ever holding up the supervisor loop.

Each target has a bounded queue and one worker task. `offer` (called from the journal, on the
loop's thread or any other) only decides and enqueues; a full queue drops its oldest event (the
newest, e.g. `recovered`, is the one worth having) and counts the drop. A worker tries each event
up to `1 + retries` times with exponential backoff, journals the outcome (`notification`:
ok, failed or dropped) and counts it in `sglang_supervisor_notifications_total`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final

import httpx
import structlog
from prometheus_client import CollectorRegistry, Counter

from supervisor.alerting import deliver
from supervisor.alerting.events import NotifyEvent, Tracker
from supervisor.config.alerting import NotifyTarget
from supervisor.status.eventnames import EventName
from supervisor.status.journal import Journal

log = structlog.get_logger(__name__)
OUTCOMES = ("ok", "failed", "dropped")
JOURNAL_EVENT: Final[EventName] = "notification"


@dataclass(frozen=True)
class _Lane:
    target: NotifyTarget
    secrets: deliver.Secrets
    queue: asyncio.Queue[NotifyEvent]


class NotifyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.deliveries = Counter(
            "sglang_supervisor_notifications",
            "Notifications by [[notify]] target, event and outcome (ok, failed after its retries, dropped)",
            ["target", "event", "outcome"],
            registry=registry,
        )

    def declare(self, targets: tuple[NotifyTarget, ...]) -> None:
        for t in targets:
            for kind in t.wanted:
                for outcome in OUTCOMES:
                    self.deliveries.labels(target=t.name, event=kind, outcome=outcome)


def instance_name(host: str, port: int) -> str:
    """`hostname:port`: which server of which host, even with several on one host."""
    name = socket.gethostname() or "localhost"
    return f"{name}:{port}" if host in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "::") else f"{host}:{port}"


class Alerter:
    """The notification lanes of one daemon; `start` on the loop, `offer` records, `close` at exit."""

    def __init__(
        self,
        targets: tuple[NotifyTarget, ...],
        *,
        journal: Journal,
        metrics: NotifyMetrics,
        instance: str,
        hook_env: Mapping[str, str],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        preferred: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._lanes = [_Lane(t, deliver.load_secrets(t), asyncio.Queue(t.queue_size)) for t in targets]
        self._journal = journal
        self._metrics = metrics
        self._tracker = Tracker(instance, preferred)
        self._hook_env = dict(hook_env)
        self._sleep = sleep
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self._busy = 0
        self._client: httpx.AsyncClient | None = None
        metrics.declare(targets)

    @property
    def targets(self) -> tuple[NotifyTarget, ...]:
        return tuple(lane.target for lane in self._lanes)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        if any(lane.target.kind == "webhook" for lane in self._lanes):
            self._client = httpx.AsyncClient(trust_env=False, follow_redirects=False)
        self._tasks = [asyncio.create_task(self._work(lane), name=f"notify-{lane.target.name}") for lane in self._lanes]

    def offer(self, record: dict[str, object]) -> None:
        """A journal record; never raises, never blocks (the journal calls this on every append)."""
        if record.get("event") == JOURNAL_EVENT or self._loop is None:
            return
        if threading.get_ident() != self._thread:
            with contextlib.suppress(RuntimeError):  # the loop closed: the daemon is exiting
                self._loop.call_soon_threadsafe(self.offer, record)
            return
        ev = self._tracker.feed(record)
        if ev is None:
            return
        for lane in self._lanes:
            if ev.kind in lane.target.wanted:
                self._enqueue(lane, ev)

    def _enqueue(self, lane: _Lane, ev: NotifyEvent) -> None:
        if lane.queue.full():
            old = lane.queue.get_nowait()
            lane.queue.task_done()
            self._outcome(lane, old, "dropped", 0, error=f"queue full ({lane.target.queue_size})")
        lane.queue.put_nowait(ev)

    async def _work(self, lane: _Lane) -> None:
        while True:
            ev = await lane.queue.get()
            self._busy += 1
            try:
                await self._deliver(lane, ev)
            except Exception as err:  # a delivery is never worth the daemon
                log.error("notification_error", target=lane.target.name, error=lane.secrets.redact(repr(err))[:300])
            finally:
                self._busy -= 1
                lane.queue.task_done()

    async def _deliver(self, lane: _Lane, ev: NotifyEvent) -> None:
        t = lane.target
        delay = t.backoff_initial_s
        attempt = deliver.Attempt(False, True)
        for n in range(1, t.retries + 2):
            if t.kind == "exec":
                attempt = await deliver.run_hook(t, ev, self._hook_env)
            else:
                assert self._client is not None
                attempt = await deliver.post(self._client, t, ev, lane.secrets)
            if attempt.ok or not attempt.retry or n > t.retries:
                break
            log.info("notification_retry", target=t.name, notified=ev.kind, attempt=n, error=attempt.error, in_s=delay)
            await self._sleep(delay)
            delay = min(t.backoff_max_s, max(delay * 2, 0.1))
        self._outcome(lane, ev, "ok" if attempt.ok else "failed", n, status=attempt.status, error=attempt.error)

    def _outcome(
        self, lane: _Lane, ev: NotifyEvent, outcome: str, attempts: int, *, status: int | None = None, error: str = ""
    ) -> None:
        t = lane.target
        error = lane.secrets.redact(error)
        self._metrics.deliveries.labels(target=t.name, event=ev.kind, outcome=outcome).inc()
        fields: dict[str, object] = {
            "target": t.name,
            "kind": t.kind if t.kind == "exec" else t.format,
            "notified": ev.kind,
            "outcome": outcome,
            "attempts": attempts,
            "incident_id": ev.incident_id,
        }
        if status is not None:
            fields["status"] = status
        if error:
            fields["error"] = error
        self._journal.append(JOURNAL_EVENT, **fields)
        (log.info if outcome == "ok" else log.warning)(JOURNAL_EVENT, **fields)

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every queue is empty and no delivery runs; False at the timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(not lane.queue.empty() for lane in self._lanes) or self._busy:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def close(self, grace_s: float = 5.0) -> None:
        """At exit: give what is queued (a `failed` just before a shutdown) `grace_s`, then stop."""
        with contextlib.suppress(Exception):
            await self.drain(grace_s)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._client is not None:
            await self._client.aclose()
            self._client = None
