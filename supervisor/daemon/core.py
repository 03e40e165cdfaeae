"""The supervisor's state and its primitives: what the acting helpers (`actions`, `handlers`) work on.

`Core` holds the server tree, the lifecycle state, the ladder and the records, and the small
operations on them (move, persist, publish, observe, heartbeat). It imports nothing that acts:
`supervisor.daemon.actions` and `supervisor.daemon.handlers` take a `Core`, and `supervisor.daemon.loop.Supervisor`,
the one owner of the lifecycle, extends it with the loop and calls them. So imports flow one way:
daemon -> handlers -> actions -> core. The one call back, `handle` (a command arriving while a
backoff is being waited out), is declared here and implemented by the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import structlog

from probes.gpu import GpuProbe
from probes.gpuscope import DeviceScope
from probes.types import Observation
from supervisor.clock import Clock
from supervisor.config.render import arg_names, render_rung
from supervisor.config.settings import Settings
from supervisor.daemon.adopt import ServerRecord
from supervisor.daemon.apiguard import GuardStats
from supervisor.daemon.commands import Command
from supervisor.daemon.counting import RestartingCount
from supervisor.daemon.journal import Journal
from supervisor.daemon.metrics import SupervisorMetrics
from supervisor.daemon.observe import Observer, Target
from supervisor.daemon.persist import Decided, OpenIncident, Persisted, marker_for, save
from supervisor.daemon.publish import Facts, build, stale_after
from supervisor.daemon.sdnotify import Notifier, WatchdogPacer
from supervisor.daemon.snapshot import IncidentView, LogKeeperView, StatusSnapshot, StopView, ToolCheck, WriteErrorsView
from supervisor.daemon.xidbook import XidBook
from supervisor.group.runtime import GroupRuntime
from supervisor.group.view import group_view
from supervisor.logs.capture import LogCapture
from supervisor.logs.tending import KeeperStatus
from supervisor.policy.gpuwait import wants_look
from supervisor.policy.ladder import LadderState
from supervisor.policy.lifecycle import RUNNING, SERVING, Lifecycle, State
from supervisor.policy.watchdog import History, new_history
from supervisor.process.control import Child, LogFiles, PendingLaunch, ProcessControl, RealProcessControl

log = structlog.get_logger("supervisor")
T = TypeVar("T")
# A successor re-reads the log lines of at most this window (duplicates, never losses); each save
# is one small fsynced write of state.json.
LOG_POSITION_SAVE_S = 5.0


class Core:
    """The supervisor's state and primitives; `supervisor.daemon.loop.Supervisor` adds the loop."""

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
        self.lifecycle = Lifecycle(State.STOPPED, clock.monotonic())
        self.reason = "not started"
        self.since_wall = clock.wall()
        self.observer = observer or Observer(settings, gpu, clock.monotonic)
        self.control: ProcessControl = control or RealProcessControl()
        self.queue: asyncio.Queue[Command] = asyncio.Queue()
        self.ladder = LadderState()
        # Derived, so a tree is findable without state.json; a predecessor's saved marker (an older
        # version's random one) replaces it until that tree is adopted or stopped (`own_marker`).
        self.marker = marker_for(self.state_dir)
        self.history: History | None = None
        self.obs: Observation | None = None
        self.last_incident: IncidentView | None = None
        self.incidents = 0
        self.restarts = 0
        self.selfcheck: tuple[ToolCheck, ...] = ()
        self.diagnosing = False
        self.restart_pending = False
        self.next_attempt_at: float | None = None
        self.failed_retry_at: float | None = None  # monotonic; when `failed` starts again by itself
        self.loop_errors = 0
        self.port_refusals = 0  # launches refused in a row because the port was held
        self.gpu_refusals = 0  # ... because a stranger held GPU memory (supervisor.daemon.slate)
        self.pending_launch: PendingLaunch | None = None
        self.incident_ids: list[str] = []  # recent ids, so two in one second differ
        self.open_incident: OpenIncident | None = None  # persisted while its capture runs
        self.decided: Decided | None = None  # persisted from the ladder's decision until the launch
        self.api_guard = GuardStats()  # connections the API refused or timed out (apiguard)
        self.resume_after_error = False  # a restart was cut short by an exception: finish it
        self.unknown_observations = 0
        self.state_write_errors = 0
        self.bundle_write_errors = 0
        # Server-log write errors for /status and /metrics alike: each keeper starts its stats file at 0.
        self.log_write_errors = RestartingCount()
        self.counted_writes = WriteErrorsView()  # what the metrics counter has been told
        self.time_to_ready_s: float | None = None
        self.ready_at: float | None = None
        self.adopted = False  # the server was taken over from an earlier daemon
        self.takeover_s: float | None = None  # adoption to ready, for an adopted server
        self.last_stop: StopView | None = None
        self.stable_marked = False
        self.spec_alerted = False
        self.shutdown_requested = False
        self.heartbeat = clock.monotonic()
        self.on_reload: Callable[[Settings], Awaitable[None]] | None = None
        self.server: Child | None = None
        self.server_record: ServerRecord | None = None  # what a successor needs to adopt `server`
        self.stopped_by_request = False  # persisted: a daemon restart leaves such a server stopped
        self.handoff = False  # exiting for a successor (SIGUSR2): leave the server running
        self.persisted_at = clock.monotonic()
        self.capture: LogCapture | None = None
        self.keeper: KeeperStatus | None = None  # the log keeper at the last poll (supervisor.logs.tending)
        self.keepers_replaced = 0
        self.log_seq = 0
        self.launched_at = clock.monotonic()
        self.launched_wall: float | None = None
        self.xids = XidBook()  # GPU faults: supervisor.daemon.xids
        self.group: GroupRuntime | None = None  # [group]: supervisor.daemon.grouping
        self._snapshot = StatusSnapshot(state=State.STOPPED.value)
        self.publish_listeners: list[Callable[[StatusSnapshot], None]] = []  # e.g. the page's timeline
        self.metrics = metrics(self.snapshot)
        self.publish()

    def snapshot(self) -> StatusSnapshot:
        return self._snapshot

    def server_pid(self) -> int | None:
        return self.server.pid if self.server is not None else None

    def heartbeat_age(self) -> float:
        return self.clock.monotonic() - self.heartbeat

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
        """Await bounded blocking work (a stop, a capture) while the loop keeps proving it cycles."""
        task = asyncio.ensure_future(work)
        while True:
            done, _ = await asyncio.wait({task}, timeout=1.0)
            self.beat()
            if done:
                return task.result()

    def persist(self) -> None:
        try:
            names = tuple(r.name for r in self.settings.ladder)
            record = self.server_record
            if record is not None and self.capture is not None:
                record = replace(record, log=self.capture.position or record.log)
                self.server_record = record
            saved = Persisted(
                self.marker,
                self.ladder,
                names,
                self.open_incident,
                record,
                self.stopped_by_request,
                self.decided,
                last_incident=self.last_incident,
            )
            save(self.state_dir / "state.json", saved)
            self.persisted_at = self.clock.monotonic()
        except OSError as err:
            self.state_write_errors += 1
            log.error("state_save_failed", error=str(err))
            self.journal.append("state_save_failed", error=str(err))

    def save_log_position(self) -> None:
        """Every LOG_POSITION_SAVE_S, the log position a successor resumes from (it re-reads at most that)."""
        record, cap = self.server_record, self.capture
        if record is None or cap is None or self.clock.monotonic() - self.persisted_at < LOG_POSITION_SAVE_S:
            return
        if cap.position is not None and cap.position != record.log:
            self.persist()

    def move(self, state: State, reason: str) -> None:
        old = self.lifecycle.state
        self.lifecycle.move(state, self.clock.monotonic(), reason)
        self.reason = reason
        if state != State.FAILED:
            self.failed_retry_at = None
        if state != State.RESTARTING:
            self.pending_launch = None
        if old != state:
            self.since_wall = self.clock.wall()
            rung = self.current_rung_name()
            log.info("state_changed", old=old.value, new=state.value, reason=reason, rung=rung)
            self.journal.append("state_changed", old=old.value, new=state.value, reason=reason, rung=rung)
            self.notifier.status(f"state={state.value} rung={rung} pid={self.server_pid() or '-'}")
        self.publish()

    def current_rung_name(self) -> str:
        ladder = self.settings.ladder
        return ladder[min(self.ladder.current, len(ladder) - 1)].name

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

    def speculative(self) -> tuple[bool, ...]:
        return self._speculative

    async def observe(self) -> Observation:
        server = self.server
        if self.capture is not None:
            lines = self.capture.lines_since(self.log_seq)
            if lines:
                self.observer.feed(lines)
                self.log_seq = lines[-1].seq
        target = Target(
            root_pid=server.pid if server is not None else None,
            root_exit=server.poll() if server is not None else None,
            marker=self.marker,
            serving=self.lifecycle.state in SERVING,
            # A worker node's /metrics is SGLang's dummy health server's: nothing to scrape there.
            metrics=self._metrics_on[self.ladder.current] and (self.group is None or self.group.is_leader),
            look=self._wants_look(),
        )
        obs = await self.observer.observe(target)
        if obs.health is not None:
            self.metrics.health(obs.health.latency_s, obs.health.ok)
        self.obs = obs
        return obs

    def _wants_look(self) -> bool:
        """A py-spy look at the busy threads: while starting, once CPU alone moved half a window."""
        h = self.history
        if self.lifecycle.state != State.STARTING or h is None or h.ready_at is not None:
            return False
        now = self.clock.monotonic()
        cpu_quiet = now - h.moved_at.get("cpu", h.launched_at)
        return wants_look(now - h.last_progress_at, cpu_quiet, self.settings.watchdog)

    def publish(self) -> None:
        now = self.clock.monotonic()
        st = self.lifecycle.state
        running = st in RUNNING or st in (State.HUNG, State.DIAGNOSING)
        nxt = None
        if self.next_attempt_at is not None and st == State.RESTARTING:
            nxt = round(max(0.0, self.next_attempt_at - now), 3)
        if self.failed_retry_at is not None and st == State.FAILED:
            nxt = round(max(0.0, self.failed_retry_at - now), 3)
        wd = self.settings.watchdog
        self._snapshot = build(
            Facts(
                state=st.value,
                reason=self.reason,
                since_wall=self.since_wall,
                state_age_s=now - self.lifecycle.since,
                rung=self.current_rung_name(),
                rung_index=self.ladder.current,
                last_good=(
                    self.settings.ladder[self.ladder.last_good].name
                    if self.ladder.last_good is not None and self.ladder.last_good < len(self.settings.ladder)
                    else None
                ),
                ladder=tuple(r.name for r in self.settings.ladder),
                pid=self.server_pid(),
                restarts=self.restarts,
                restarts_last_hour=self.ladder.restarts_within_hour(self.clock.wall()),
                started_wall=self.launched_wall,
                time_to_ready_s=self.time_to_ready_s if st in SERVING else None,
                next_attempt_in_s=nxt,
                last_incident=self.last_incident,
                incidents=self.incidents,
                selfcheck=self.selfcheck,
                diagnosing=self.diagnosing,
                version=self.version,
                now=now,
                history=self.history,
                observation=self.obs,
                health=self.observer.last_health,
                serving=self.observer.last_serving,
                running=running,
                loop_errors=self.loop_errors,
                write_errors=self.write_errors(),
                log_keeper=self.keeper_view(),
                last_stop=self.last_stop,
                adopted=self.adopted and running,
                takeover_s=self.takeover_s if st in SERVING else None,
                stale_after_s=stale_after(wd.metrics_interval_s, wd.serving_stall_s),
                busy=self.observer.last_busy,
            )
        )
        if self.xids.recent or self.xids.blocked is not None:
            update = {"gpu_xids": self.xids.views(), "gpu_blocked": self.xids.blocked_reason()}
            self._snapshot = self._snapshot.model_copy(update=update)
        if self.group is not None:
            self._snapshot = self._snapshot.model_copy(update={"group": group_view(self.group, self._snapshot)})
        self.count_write_errors()
        for listener in self.publish_listeners:
            with contextlib.suppress(Exception):  # a view's bug must not cost a poll
                listener(self._snapshot)

    def keeper_view(self) -> LogKeeperView | None:
        k = self.keeper
        if k is None or self.server is None:
            return None
        return LogKeeperView(
            pid=k.pid,
            condition=k.condition,
            replaced=self.keepers_replaced,
            pipe_bytes=k.pipe_bytes,
            pipe_size=k.pipe_size,
        )

    def write_errors(self) -> WriteErrorsView:
        return WriteErrorsView(
            journal=self.journal.write_errors,
            server_log=self.server_log_write_errors(),
            state=self.state_write_errors,
            bundle=self.bundle_write_errors,
        )

    def server_log_write_errors(self) -> int:
        cap = self.capture
        return self.log_write_errors.feed(cap.stats.write_errors if cap is not None else self.log_write_errors.seen)

    def count_write_errors(self) -> None:
        """Feed the metrics counter what grew since the last publish (the counts live in their writers)."""
        now, before = self._snapshot.write_errors, self.counted_writes
        for what in ("journal", "server_log", "state", "bundle"):
            self.metrics.write_error(what, getattr(now, what) - getattr(before, what))
        self.counted_writes = now

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
        self.journal.append("config_reloaded", ladder=[r.name for r in settings.ladder])
        log.info("config_reloaded", ladder=[r.name for r in settings.ladder])
        self.publish()

    def fresh_server_view(self, launched_wall: float) -> None:
        """A new server (launched or adopted): nothing the previous one showed carries over."""
        self.observer.reset()
        self.history = new_history(self.clock.monotonic())
        self.obs = None
        self.ready_at = None
        self.time_to_ready_s = None
        self.adopted = False
        self.takeover_s = None
        self.spec_alerted = False
        self.launched_at = self.clock.monotonic()
        self.launched_wall = launched_wall

    def log_files(self) -> LogFiles:
        """Where the log keeper writes the server's output, and how much it keeps."""
        logs = self.settings.logs
        return LogFiles(
            self.state_dir / "logs",
            int(logs.max_file_mb * 1024 * 1024),
            logs.backups,
            journal_socket=logs.journal_socket if logs.journal else None,
            journal_id=logs.journal_identifier,
        )

    def child_env(self, extra: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in self.env.items() if k not in _NOT_FOR_CHILD}
        env.pop(self.settings.api.token_env, None)
        env.update(extra)
        return env

    def random(self) -> float:
        return self.rand()

    async def handle(self, cmd: Command) -> None:
        """Carry out a command (the owner routes it to `supervisor.daemon.handlers`)."""
        raise NotImplementedError


_NOT_FOR_CHILD = frozenset(
    {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "INVOCATION_ID"}
)
