"""The owner's state and its primitives: the records (`supervisor.daemon.records`), moving between
states, persisting, publishing, observing, and `record` (the journal line and the log line of one
event, written together).

`OwnerState` is the first part of the one owner, `supervisor.daemon.owner.Supervisor`: OwnerState
(records, primitives) <- `owner_lifecycle.ServerLifecycle` (launch, incident, stop) <-
`owner_watch.ServerWatch` (the tick's watch over a running server) <- `owner.Supervisor` (the loop,
the commands, start-up and adoption). One class, split over four files only to keep each small. No
helper imports any of them: helpers take explicit values and return outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import structlog

from probes.gpu import GpuProbe
from probes.gpuscope import DeviceScope
from probes.types import Observation
from supervisor.clock import Clock
from supervisor.config.render import arg_names, render_rung
from supervisor.config.settings import Settings
from supervisor.daemon.beating import keep_beating
from supervisor.daemon.counting import RestartingCount
from supervisor.daemon.incidentids import unique_incident_id
from supervisor.daemon.observe import Observer, Target
from supervisor.daemon.persist import Persisted, marker_for, save
from supervisor.daemon.publish import Facts, build, stale_after
from supervisor.daemon.records import Counters, InHand, Pending, Slot
from supervisor.daemon.shmledger import ShmLedger
from supervisor.daemon.stopping import StopTools
from supervisor.daemon.xidbook import XidBook
from supervisor.host.apiguard import GuardStats
from supervisor.host.sdnotify import Notifier, WatchdogPacer
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.policy.gpuwait import wants_look
from supervisor.policy.ladder import LadderState
from supervisor.policy.lifecycle import RUNNING, SERVING, Lifecycle, State
from supervisor.policy.watchdog import new_history
from supervisor.process.control import ProcessControl, RealProcessControl
from supervisor.status.commands import Command
from supervisor.status.eventnames import EventName
from supervisor.status.journal import Journal
from supervisor.status.snapshot import LogKeeperView, StatusSnapshot, StopView, ToolCheck, WriteErrorsView

log = structlog.get_logger(__name__)
T = TypeVar("T")
# A successor re-reads the log lines of at most this window (duplicates, never losses); each save
# is one small fsynced write of state.json.
LOG_POSITION_SAVE_S = 5.0


class OwnerState:
    """The supervisor's records and primitives; `owner.Supervisor` adds the lifecycle and the loop."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock,
        metrics: Callable[[Callable[[], StatusSnapshot]], SupervisorMetrics],
        gpu: GpuProbe,
        env: Mapping[str, str],
        config_path: Path | None = None,
        notifier: Notifier | None = None,
        rand: Callable[[], float] = random.random,
        version: str = "",
        control: ProcessControl | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.env = dict(env)
        self.config_path = config_path
        self.notifier = notifier or Notifier.from_env({})
        self.pacer = WatchdogPacer(self.notifier.watchdog_interval_s)
        self.rand = rand
        self.version = version
        self.state_dir = settings.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(self.state_dir / "events.jsonl")
        self.log = log  # rebound per launch or adoption: rung and pid on every line (`record`)
        self.lifecycle = Lifecycle(State.STOPPED, clock.monotonic())
        self.reason = "not started"
        self.since_wall = clock.wall()
        self.observer = observer or Observer(settings, gpu, clock.monotonic)
        self.control: ProcessControl = control or RealProcessControl()
        self.queue: asyncio.Queue[Command] = asyncio.Queue()
        self.ladder = LadderState()
        # Derived, so a tree is findable without state.json; a predecessor's saved marker (an older
        # version's random one) replaces it until that tree is adopted or stopped.
        self.marker = marker_for(self.state_dir)
        # The records: the current server, the counts, the one pending timer, the incident in hand.
        self.slot = Slot(launched_at=clock.monotonic())
        self.shm_ledger = ShmLedger(self.state_dir, clock.monotonic)  # what the clean slate may remove
        self.counters = Counters()
        self.pending: Pending | None = None
        self.inhand = InHand()
        self.selfcheck: tuple[ToolCheck, ...] = ()
        self.api_guard = GuardStats()  # connections the API refused or timed out (apiguard)
        # Server-log write errors for /status and /metrics alike: each keeper starts its stats file at 0.
        self.log_write_errors = RestartingCount()
        self.counted_writes = WriteErrorsView()  # what the metrics counter has been told
        self.last_stop: StopView | None = None
        self.shutdown_requested = False
        self.heartbeat = clock.monotonic()
        self.on_reload: Callable[[Settings], Awaitable[None]] | None = None
        self.stopped_by_request = False  # persisted: a daemon restart leaves such a server stopped
        self.handoff = False  # exiting for a successor (SIGUSR2): leave the server running
        self.persisted_at = clock.monotonic()
        self.xids = XidBook()  # GPU faults: supervisor.daemon.xids
        self._snapshot = StatusSnapshot(state=State.STOPPED.value)
        self.publish_listeners: list[Callable[[StatusSnapshot], None]] = []  # e.g. the page's timeline
        self.metrics = metrics(self.snapshot)
        self.publish()

    # ---- what others read ---------------------------------------------------------------

    def snapshot(self) -> StatusSnapshot:
        return self._snapshot

    def server_pid(self) -> int | None:
        return self.slot.pid

    def heartbeat_age(self) -> float:
        return self.clock.monotonic() - self.heartbeat

    def current_rung_name(self) -> str:
        ladder = self.settings.ladder
        return ladder[min(self.ladder.current, len(ladder) - 1)].name

    def speculative(self) -> tuple[bool, ...]:
        return self._speculative

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, value: Settings) -> None:
        """Settings change only here (start, SIGHUP): what each rung implies is derived once."""
        self._settings = value
        flags = [arg_names(render_rung(value.server, r).argv) for r in value.ladder]
        self._speculative = tuple("speculative-algorithm" in f for f in flags)
        self._metrics_on = tuple("enable-metrics" in f for f in flags)

    # ---- the one way an event is written -------------------------------------------------

    def record(self, event: EventName, level: str = "info", /, **fields: Any) -> None:
        """One event: its journal line and its log line (with the launch's bound rung and pid)."""
        self.journal.append(event, **fields)
        getattr(self.log, level)(event, **fields)

    def bind_server(self) -> None:
        """Once per launch or adoption: every log line of the daemon names the server's rung and pid."""
        self.log = log.bind(rung=self.current_rung_name(), pid=self.slot.pid)

    # ---- the loop's pulse ---------------------------------------------------------------

    async def next_command(self, timeout: float) -> Command | None:
        """The next queued command, or None once `timeout` has passed on the injected clock."""
        self.beat()
        if timeout <= 0:
            try:
                return self.queue.get_nowait()
            except asyncio.QueueEmpty:
                return None
        get = asyncio.ensure_future(self.queue.get())
        timer = asyncio.ensure_future(self.clock.sleep(timeout))
        await asyncio.wait({get, timer}, return_when=asyncio.FIRST_COMPLETED)
        timer.cancel()
        if not get.done():
            get.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await get
        return get.result() if get.done() and not get.cancelled() else None

    def beat(self) -> None:
        """Proof the loop cycles: systemd's WATCHDOG=1 goes out only from here."""
        now = self.clock.monotonic()
        self.heartbeat = now
        if self.pacer.due(now):
            self.notifier.watchdog()
            self.pacer.mark(now)

    async def beating(self, work: Awaitable[T]) -> T:
        return await keep_beating(work, self.beat)

    def stop_tools(self) -> StopTools:
        rs, srv = self.settings.restart, self.settings.server
        return StopTools(
            self.control, self.observer.gpu, self.clock, self.beat, srv.host, srv.port, rs.stop_grace_s,
            rs.release_timeout_s,
        )  # fmt: skip

    # ---- state ----------------------------------------------------------------------------

    def move(self, state: State, reason: str) -> None:
        old = self.lifecycle.state
        self.lifecycle.move(state, self.clock.monotonic(), reason)
        self.reason = reason
        if self.pending is not None and state != self.pending.waits_in:
            self.pending = None  # leaving the state a timer waits in cancels it
        if old != state:
            self.since_wall = self.clock.wall()
            rung = self.current_rung_name()
            self.record("state_changed", old=old.value, new=state.value, reason=reason, rung=rung)
            self.notifier.status(f"state={state.value} rung={rung} pid={self.server_pid() or '-'}")
        self.publish()

    def wait_then(self, pending: Pending) -> None:
        """Set the one pending timer (the tick carries it out when due)."""
        self.pending = pending
        self.publish()

    def persist(self) -> None:
        try:
            names = tuple(r.name for r in self.settings.ladder)
            slot, inhand = self.slot, self.inhand
            if slot.record is not None and slot.capture is not None:
                slot.record = replace(slot.record, log=slot.capture.position or slot.record.log)
            saved = Persisted(
                self.marker,
                self.ladder,
                names,
                inhand.open_incident,
                slot.record,
                self.stopped_by_request,
                inhand.decided,
                last_incident=inhand.last_incident,
            )
            save(self.state_dir / "state.json", saved)
            self.persisted_at = self.clock.monotonic()
        except OSError as err:
            self.counters.state_write_errors += 1
            self.record("state_save_failed", "error", error=str(err))

    def save_log_position(self) -> None:
        """Every LOG_POSITION_SAVE_S, the log position a successor resumes from (it re-reads at most that)."""
        record, cap = self.slot.record, self.slot.capture
        if record is None or cap is None or self.clock.monotonic() - self.persisted_at < LOG_POSITION_SAVE_S:
            return
        if cap.position is not None and cap.position != record.log:
            self.persist()

    def fresh_slot(self, launched_wall: float) -> None:
        """A new server (launched or adopted): nothing the previous one showed carries over."""
        self.observer.reset()
        now = self.clock.monotonic()
        self.slot = Slot(launched_at=now, launched_wall=launched_wall, history=new_history(now))

    def unique_incident_id(self, cause: str) -> str:
        diagnostics = self.settings.state_dir / "diagnostics"
        return unique_incident_id(self.clock.wall(), cause, self.inhand.incident_ids, diagnostics)

    def reload(self, settings: Settings) -> None:
        """SIGHUP: thresholds and ladder change without touching a healthy server."""
        old_names = tuple(r.name for r in self.settings.ladder)
        current = old_names[self.ladder.current] if self.ladder.current < len(old_names) else None
        self.settings = settings
        self.observer.configure(settings)
        self.observer.gpu.scope = DeviceScope.for_server(settings.server.env, self.env)  # CUDA_VISIBLE_DEVICES
        idx = settings.rung_index(current) if current is not None else None
        if idx is None:
            idx = min(self.ladder.current, len(settings.ladder) - 1)
        last_good = self.ladder.last_good
        if last_good is not None and last_good < len(old_names):
            last_good = settings.rung_index(old_names[last_good])
        self.ladder = LadderState(**{**self.ladder.__dict__, "current": idx, "last_good": last_good})
        self.persist()
        self.record("config_reloaded", ladder=[r.name for r in settings.ladder])
        self.publish()

    # ---- observing and publishing ---------------------------------------------------------

    async def observe(self) -> Observation:
        slot = self.slot
        if slot.capture is not None:
            lines = slot.capture.lines_since(slot.log_seq)
            if lines:
                self.observer.feed(lines)
                slot.log_seq = lines[-1].seq
        child = slot.child
        target = Target(
            root_pid=child.pid if child is not None else None,
            root_exit=child.poll() if child is not None else None,
            marker=self.marker,
            serving=self.lifecycle.state in SERVING,
            metrics=self._metrics_on[self.ladder.current],
            look=self._wants_look(),
        )
        obs = await self.observer.observe(target)
        if obs.health is not None:
            self.metrics.health(obs.health.latency_s, obs.health.ok)
        slot.obs = obs
        pids = obs.tree.pids if child is not None else ()
        if pids and self.shm_ledger.due(pids):
            await asyncio.to_thread(self.shm_ledger.note, pids, self.settings.restart.shm_dir)
        return obs

    def _wants_look(self) -> bool:
        """A py-spy look at the busy threads: while starting, once CPU alone moved half a window."""
        h = self.slot.history
        if self.lifecycle.state != State.STARTING or h is None or h.ready_at is not None:
            return False
        now = self.clock.monotonic()
        cpu_quiet = now - h.moved_at.get("cpu", h.launched_at)
        return wants_look(now - h.last_progress_at, cpu_quiet, self.settings.watchdog)

    def publish(self) -> None:
        now = self.clock.monotonic()
        st = self.lifecycle.state
        slot, inhand, counts = self.slot, self.inhand, self.counters
        running = st in RUNNING or st in (State.HUNG, State.DIAGNOSING)
        nxt = None
        if self.pending is not None and st == self.pending.waits_in:
            nxt = round(max(0.0, self.pending.at - now), 3)
        wd = self.settings.watchdog
        last_good = self.ladder.last_good
        self._snapshot = build(
            Facts(
                state=st.value,
                reason=self.reason,
                since_wall=self.since_wall,
                state_age_s=now - self.lifecycle.since,
                rung=self.current_rung_name(),
                rung_index=self.ladder.current,
                last_good=(
                    self.settings.ladder[last_good].name
                    if last_good is not None and last_good < len(self.settings.ladder)
                    else None
                ),
                ladder=tuple(r.name for r in self.settings.ladder),
                pid=self.server_pid(),
                restarts=counts.restarts,
                restarts_last_hour=self.ladder.restarts_within_hour(self.clock.wall()),
                started_wall=slot.launched_wall,
                time_to_ready_s=slot.time_to_ready_s if st in SERVING else None,
                next_attempt_in_s=nxt,
                last_incident=inhand.last_incident,
                incidents=counts.incidents,
                selfcheck=self.selfcheck,
                diagnosing=inhand.diagnosing,
                version=self.version,
                now=now,
                history=slot.history,
                observation=slot.obs,
                health=self.observer.last_health,
                serving=self.observer.last_serving,
                running=running,
                loop_errors=counts.loop_errors,
                write_errors=self.write_errors(),
                log_keeper=self.keeper_view(),
                last_stop=self.last_stop,
                adopted=slot.adopted and running,
                takeover_s=slot.takeover_s if st in SERVING else None,
                stale_after_s=stale_after(wd.metrics_interval_s, wd.serving_stall_s),
                busy=self.observer.last_busy,
            )
        )
        if self.xids.recent or self.xids.blocked is not None:
            update = {"gpu_xids": self.xids.views(), "gpu_blocked": self.xids.blocked_reason()}
            self._snapshot = self._snapshot.model_copy(update=update)
        self.count_write_errors()
        for listener in self.publish_listeners:
            with contextlib.suppress(Exception):  # a view's bug must not cost a poll
                listener(self._snapshot)

    def keeper_view(self) -> LogKeeperView | None:
        k = self.slot.keeper
        if k is None or self.slot.child is None:
            return None
        return LogKeeperView(
            pid=k.pid,
            condition=k.condition,
            replaced=self.counters.keepers_replaced,
            pipe_bytes=k.pipe_bytes,
            pipe_size=k.pipe_size,
        )

    def write_errors(self) -> WriteErrorsView:
        return WriteErrorsView(
            journal=self.journal.write_errors,
            server_log=self.server_log_write_errors(),
            state=self.counters.state_write_errors,
            bundle=self.counters.bundle_write_errors,
        )

    def server_log_write_errors(self) -> int:
        cap = self.slot.capture
        return self.log_write_errors.feed(cap.stats.write_errors if cap is not None else self.log_write_errors.seen)

    def count_write_errors(self) -> None:
        """Feed the metrics counter what grew since the last publish (the counts live in their writers)."""
        now, before = self._snapshot.write_errors, self.counted_writes
        for what in ("journal", "server_log", "state", "bundle"):
            self.metrics.write_error(what, getattr(now, what) - getattr(before, what))
        self.counted_writes = now
