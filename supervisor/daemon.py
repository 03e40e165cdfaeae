"""The supervisor task: observe, decide, act, record, once per poll.

Commands (API, signals) arrive on one queue and only this task touches processes. Blocking work
(probes, stopping the tree, dumps) runs in threads or subprocesses so the API stays responsive.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TypeVar

import structlog

from probes.gpu import GpuProbe
from probes.types import Observation
from supervisor import actions, handlers, upkeep
from supervisor.apiguard import GuardStats
from supervisor.clock import Clock
from supervisor.commands import Command, CommandResult
from supervisor.config import Settings, arg_names, render_rung
from supervisor.control import Child, PendingLaunch, ProcessControl, RealProcessControl
from supervisor.diagnostics import self_check
from supervisor.journal import Journal
from supervisor.ladder import LadderState, record_end, record_ready, record_stable, resume_rung
from supervisor.logcapture import LogCapture
from supervisor.metrics import SupervisorMetrics
from supervisor.notify import Notifier, WatchdogPacer
from supervisor.observe import Observer, Target
from supervisor.persist import OpenIncident, Persisted, load, new_marker, save
from supervisor.publish import Facts, build
from supervisor.snapshot import IncidentView, StatusSnapshot, ToolCheck, WriteErrorsView
from supervisor.state import RUNNING, SERVING, Lifecycle, State
from supervisor.watchdog import History, Mode, Verdict, assess, new_history

log = structlog.get_logger("supervisor")
T = TypeVar("T")


class Supervisor:
    """Owns the server tree, its lifecycle state and the ladder; the API sees `snapshot`/`submit`."""

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
        self.marker = new_marker()
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
        self.pending_launch: PendingLaunch | None = None
        self.incident_ids: list[str] = []  # recent ids, so two in one second differ
        self.open_incident: OpenIncident | None = None  # persisted while its capture runs
        self.api_guard = GuardStats()  # connections the API refused or timed out (apiguard)
        self.resume_after_error = False  # a restart was cut short by an exception: finish it
        self.unknown_observations = 0
        self.state_write_errors = 0
        self.bundle_write_errors = 0
        self.closed_log_write_errors = 0  # of the server logs of earlier launches
        self.counted_writes = WriteErrorsView()  # what the metrics counter has been told
        self.time_to_ready_s: float | None = None
        self.ready_at: float | None = None
        self.stable_marked = False
        self.spec_alerted = False
        self.shutdown_requested = False
        self.heartbeat = clock.monotonic()
        self.on_reload: Callable[[Settings], Awaitable[None]] | None = None
        self.server: Child | None = None
        self.capture: LogCapture | None = None
        self.log_seq = 0
        self.launched_at = clock.monotonic()
        self.launched_wall: float | None = None
        self._snapshot = StatusSnapshot(state=State.STOPPED.value)
        self.metrics = metrics(self.snapshot)
        self.publish()

    # ---- what the API sees ------------------------------------------------------------------

    def snapshot(self) -> StatusSnapshot:
        return self._snapshot

    def server_pid(self) -> int | None:
        return self.server.pid if self.server is not None else None

    async def handle(self, cmd: Command) -> None:
        await handlers.handle(self, cmd)

    def heartbeat_age(self) -> float:
        return self.clock.monotonic() - self.heartbeat

    async def submit(self, command: Command) -> CommandResult:
        early = handlers.answer_now(self, command)
        if early is not None:
            return early
        fut: asyncio.Future[CommandResult] = asyncio.get_running_loop().create_future()
        if command.kind == "restart":
            self.restart_pending = True
        if command.kind == "diagnose":
            self.diagnosing = True
        await self.queue.put(Command(**{**command.__dict__, "done": fut}))
        return await fut

    # ---- the loop -------------------------------------------------------------------------------

    async def run(self, *, autostart: bool = True) -> None:
        """Start (resuming the ladder), then poll until a shutdown command; always stop the tree."""
        try:
            try:
                await self.startup(autostart)
            except Exception as err:  # not even start-up may end the daemon
                await upkeep.survive(self, err)
                if autostart and self.lifecycle.state == State.STOPPED:
                    upkeep.start_later(self, f"start-up failed ({err!r})")
            next_tick = self.clock.monotonic()
            while not self.shutdown_requested:
                wait = max(0.0, next_tick - self.clock.monotonic())
                try:
                    cmd = await self.next_command(wait)
                    if cmd is not None:
                        await self.handle(cmd)
                        continue
                    next_tick = self.clock.monotonic() + self.settings.watchdog.poll_interval_s
                    await self.tick()
                except Exception as err:  # the loop outlives any one poll, probe, write or command
                    await upkeep.survive(self, err)
        finally:
            await actions.shutdown(self)

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

    async def startup(self, autostart: bool) -> None:
        self.selfcheck = await asyncio.to_thread(
            self_check, self.settings.diagnostics.py_spy_path, self.settings.diagnostics.gdb_path
        )
        for check in self.selfcheck:
            log.info("selfcheck", tool=check.name, ok=check.ok, detail=check.detail)
        names = tuple(r.name for r in self.settings.ladder)
        saved, why = load(self.state_dir / "state.json", names)
        if saved is not None:
            self.marker, self.ladder = saved.marker, saved.ladder
        log.info("state_loaded", detail=why, rung=names[self.ladder.current], last_good=self.ladder.last_good)
        self.journal.append("daemon_started", version=self.version, state=why, rung=names[self.ladder.current])
        if saved is not None and saved.open_incident is not None:
            upkeep.record_interrupted(self, saved.open_incident)
        self.persist()
        await actions.kill_leftovers(self)
        # The previous daemon's server, if any, was just stopped: its attempt ends here.
        self.ladder = record_end(self.ladder, "daemon_restarted", self.clock.wall())
        if autostart:
            rung = resume_rung(self.ladder, len(self.settings.ladder), self.settings.restart.start_from)
            await actions.launch(self, rung, after_incident=False)
        self.publish()

    def persist(self) -> None:
        try:
            names = tuple(r.name for r in self.settings.ladder)
            save(self.state_dir / "state.json", Persisted(self.marker, self.ladder, names, self.open_incident))
        except OSError as err:
            self.state_write_errors += 1
            log.error("state_save_failed", error=str(err))
            self.journal.append("state_save_failed", error=str(err))

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

    async def tick(self) -> None:
        st = self.lifecycle.state
        if await upkeep.chores(self):
            return
        if st not in RUNNING:
            self.publish()
            return
        obs = await self.observe()
        if self.server is not None and obs.tree.root_exit is None and not obs.tree.root_alive:
            # waitpid says the main process lives but /proc did not show it (EMFILE, EACCES, a race):
            # this poll saw nothing trustworthy, which is not "the server exited".
            self.unknown_observations += 1
            log.warning("observation_unknown", pid=self.server.pid, count=self.unknown_observations)
            self.publish()
            return
        if self.history is None:
            self.history = new_history(self.clock.monotonic())
        mode: Mode = "serving" if st in SERVING else "starting"
        spec = self.speculative()[self.ladder.current]
        verdict, self.history = assess(self.history, obs, obs.at, self.settings.watchdog, mode=mode, speculative=spec)
        await self.act(verdict, obs)
        self.publish()

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
            metrics=self._metrics_on[self.ladder.current],
        )
        obs = await self.observer.observe(target)
        if obs.health is not None:
            self.metrics.health(obs.health.latency_s, obs.health.ok)
        self.obs = obs
        return obs

    async def act(self, v: Verdict, obs: Observation) -> None:
        st = self.lifecycle.state
        now = self.clock.monotonic()
        if v.is_incident:
            assert v.cause is not None
            await actions.incident(self, v.cause, v, obs)
            return
        if st == State.STARTING:
            if v.status == "ready":
                self.ready_at = now
                self.time_to_ready_s = round(now - self.launched_at, 3)
                self.ladder = record_ready(self.ladder)
                self.persist()
                self.metrics.ready(self.time_to_ready_s)
                self.stable_marked = False
                self.journal.append("server_ready", rung=self.current_rung_name(), time_to_ready_s=self.time_to_ready_s)
                self.move(State.READY, f"ready on rung {self.current_rung_name()} in {self.time_to_ready_s:.1f} s")
            else:
                self.reason = v.reason
            return
        await self.act_serving(v, now)

    async def act_serving(self, v: Verdict, now: float) -> None:
        st = self.lifecycle.state
        if v.cause == "spec_regression":
            if self.settings.watchdog.on_spec_regression == "fallback":
                await actions.incident(self, "spec_regression", v, self.obs)
                return
            if not self.spec_alerted:
                self.spec_alerted = True
                self.incidents += 1
                self.metrics.incident("spec_regression", "none")
                self.journal.append("spec_regression", reason=v.reason, rung=self.current_rung_name())
        if v.status == "degraded" and st == State.READY:
            self.move(State.DEGRADED, v.reason)
        elif v.status == "ready" and st == State.DEGRADED:
            self.spec_alerted = False
            self.move(State.READY, "recovered")
        elif v.status == "degraded":
            self.reason = v.reason
        rs = self.settings.restart
        if self.ready_at is not None and not self.stable_marked and now - self.ready_at >= rs.stable_s:
            self.stable_marked = True
            self.ladder = record_stable(self.ladder)
            self.persist()
            self.journal.append("server_stable", rung=self.current_rung_name())
        if (
            rs.promote_after_s > 0
            and self.ladder.current > 0
            and self.ready_at is not None
            and now - self.ready_at >= rs.promote_after_s
            and self.lifecycle.state == State.READY
        ):
            self.journal.append("promotion", from_rung=self.current_rung_name(), to_rung=self.settings.ladder[0].name)
            await handlers.manual_restart(
                self, Command(kind="restart", rung=self.settings.ladder[0].name, reason="promotion")
            )

    def publish(self) -> None:
        now = self.clock.monotonic()
        st = self.lifecycle.state
        running = st in RUNNING or st in (State.HUNG, State.DIAGNOSING)
        nxt = None
        if self.next_attempt_at is not None and st == State.RESTARTING:
            nxt = round(max(0.0, self.next_attempt_at - now), 3)
        if self.failed_retry_at is not None and st == State.FAILED:
            nxt = round(max(0.0, self.failed_retry_at - now), 3)
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
                write_errors=upkeep.write_errors(self),
            )
        )
        upkeep.count_write_errors(self)

    def reload(self, settings: Settings) -> None:
        """SIGHUP: thresholds and ladder change without touching a healthy server."""
        old_names = tuple(r.name for r in self.settings.ladder)
        current = old_names[self.ladder.current] if self.ladder.current < len(old_names) else None
        self.settings = settings
        self.observer.configure(settings)
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

    def child_env(self, extra: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in self.env.items() if k not in _NOT_FOR_CHILD}
        env.pop(self.settings.api.token_env, None)
        env.update(extra)
        return env

    def random(self) -> float:
        return self.rand()


_NOT_FOR_CHILD = frozenset(
    {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "INVOCATION_ID"}
)
