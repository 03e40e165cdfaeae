"""The one owner of the supervisor's state: the loop (observe, decide, act, record, once per poll),
the one pending timer it advances, the one command dispatcher, and the incident sequence (incident,
capture, recover, launch), start-up and hand-over.

One class in one file, built by composition (STYLE 10): the current launch is a `Server`
(`supervisor.daemon.server`: spawn or adopt, observe, judge, ready, stable, tend the keeper, stop and
verify; it writes its own fields and answers what happened), the group's other daemons are its
`Peers` (`supervisor.group`), warm start is a `WarmStart` (`supervisor.warmstart`: the launch
environment and the window in force), and every event goes through one `Recorder` (the journal, the
log line and the counters subscribe). Commands (API, signals) arrive on one queue; `check` decides
whether one applies now, `handle` runs `handle_<kind>`. Waiting is the pending timer
(`policy.lifecycle.Pending`), which the tick carries out first, never a loop inside a helper.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path

from probes.gpu import GpuProbe
from probes.gpuscope import DeviceScope
from probes.types import Observation
from probes.xid import XidWatcher
from supervisor.clock import Clock, iso
from supervisor.common.configerror import ConfigError
from supervisor.config.render import arg_names, render_rung
from supervisor.config.settings import Settings, load_settings
from supervisor.daemon import slate, stopping, xids
from supervisor.daemon.beating import Pulse
from supervisor.daemon.events import Recorder
from supervisor.daemon.evidence import (
    Bundles,
    SelfChecks,
    answer_of,
    collect,
    culprit_text,
    kept_bundle,
    provisional_class,
    unique_incident_id,
)
from supervisor.daemon.observe import Observer
from supervisor.daemon.persist import Decided, InHand, OpenIncident, Persisted, load, marker_for, save, why_not_adopted
from supervisor.daemon.publish import Counters, WriteTally, build, gather
from supervisor.daemon.server import Server, SpawnRequest, child_env, log_files, port_holder_of
from supervisor.daemon.shmledger import ShmLedger
from supervisor.daemon.stopping import StopTools
from supervisor.daemon.xids import XidBook
from supervisor.diagnostics import BundleResult, Redactor
from supervisor.engines import EngineProfile, profile_of
from supervisor.group.peers import NoPeers, Peers
from supervisor.host import instance_lock
from supervisor.host.apiguard import GuardStats
from supervisor.host.sdnotify import Notifier
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.policy import recovery, validation
from supervisor.policy.ladder import (
    Decision,
    Incident,
    LadderState,
    fresh_start,
    record_end,
    record_launch,
    record_ready,
    record_stable,
    remap,
    resume_rung,
)
from supervisor.policy.lifecycle import RESTART_UNDER_WAY, RUNNING, SERVING, Leaving, Lifecycle, Pending, State
from supervisor.policy.watchdog import Mode, Verdict
from supervisor.process.control import ProcessControl, RealProcessControl
from supervisor.process.owners import STATE_DIR_ENV
from supervisor.status.causes import HUNG_CAUSES, Cause
from supervisor.status.commands import Command, CommandResult, fail_queued, finish, next_from
from supervisor.status.eventnames import EventName
from supervisor.status.snapshot import IncidentView, StatusSnapshot, StopView
from supervisor.warmstart.warm import WarmStart

# A successor re-reads the log lines of at most this window (duplicates, never losses); each save
# is one small fsynced write of state.json.
LOG_POSITION_SAVE_S = 5.0


class Owner:
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
        peers: Peers | None = None,
        xid_watcher: XidWatcher | None = None,
        publish_listeners: tuple[Callable[[StatusSnapshot], None], ...] = (),
    ) -> None:
        self.peers: Peers = peers or NoPeers()  # the group's other daemons, if any (before the settings)
        self.settings = settings
        self.clock = clock
        self.env = dict(env)
        self.config_path = config_path
        self.notifier = notifier or Notifier.from_env({})
        self.pulse = Pulse(self.notifier, clock.monotonic)  # the loop's heartbeat: /livez, WATCHDOG=1
        self.beat = self.pulse.beat
        self.rand = rand
        self.version = version
        self.state_dir = settings.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
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
        self.server = Server(launched_at=clock.monotonic())
        self.shm_ledger = ShmLedger(self.state_dir, clock.monotonic)  # what the clean slate may remove
        self.counters = Counters()
        self.pending: Pending | None = None
        self.inhand = InHand()
        self.api_guard = GuardStats()  # connections the API refused or timed out (apiguard)
        self.last_stop: StopView | None = None
        self.leaving: Leaving | None = None  # the loop ends: how the daemon leaves its server
        self.on_reload: Callable[[Settings], Awaitable[None]] | None = None  # set_reload_hook
        self.stopped_by_request = False  # persisted: a daemon restart leaves such a server stopped
        self.persisted_at = clock.monotonic()
        self.xid_watcher = xid_watcher
        self.xids = XidBook()  # GPU faults: supervisor.daemon.xids
        self._snapshot = StatusSnapshot(state=State.STOPPED.value)
        self.publish_listeners = publish_listeners  # e.g. the page's timeline
        self.metrics = metrics(self.snapshot)
        # The one way an event is written: the journal, the log line and the counters subscribe.
        self.recorder = Recorder(self.state_dir, self.metrics)
        self.record, self.journal = self.recorder.record, self.recorder.journal
        self.peers.attach(self.record, self.pulse.beating)
        self.write_tally = WriteTally(self.metrics)  # write errors: /status and the counter, one source
        self.selfcheck = SelfChecks(self.record, clock.monotonic)  # tools, ptrace, GPM, the busy signal
        # Warm start (issue 36): the launch environment and the window in force; it hears ready and stops.
        self.warm = WarmStart(settings, self.record, monotonic=clock.monotonic)
        self.recorder.bus.subscribe(lambda e: self.warm.hear(e.name, e.fields))
        self.bundles = Bundles(self.record, self.metrics, self.pulse.beating)  # evidence written and told
        self.publish()

    # ---- what others read ---------------------------------------------------------------

    def snapshot(self) -> StatusSnapshot:
        return self._snapshot

    def current_rung_name(self) -> str:
        ladder = self.settings.ladder
        return ladder[min(self.ladder.current, len(ladder) - 1)].name

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, value: Settings) -> None:
        """Settings change only here (start, SIGHUP): what each rung implies is derived once, as this
        node applies them (`Peers.fit`: a group's worker never promotes itself, nor is scraped)."""
        value = self.peers.fit(value)
        self._settings = value
        runs = [(profile_of(value.engine_of(r)), arg_names(render_rung(value.server, r).argv)) for r in value.ladder]
        self._speculative = tuple(p.speculates(f) for p, f in runs)
        scraped = self.peers.scrapes_metrics()
        self._metrics_on = tuple(scraped and p.has_metrics(f) for p, f in runs)

    def engine(self) -> EngineProfile:
        """The profile of the engine the current rung runs (a ladder may cross engines)."""
        ladder = self.settings.ladder
        return profile_of(self.settings.engine_of(ladder[min(self.ladder.current, len(ladder) - 1)]))

    # ---- the loop's pulse ---------------------------------------------------------------

    async def next_command(self, timeout: float) -> Command | None:
        """The next queued command, or None once `timeout` has passed on the injected clock."""
        self.pulse.beat()
        return await next_from(self.queue, self.clock.sleep, timeout)

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
            self.notifier.status(f"state={state.value} rung={rung} pid={self.server.pid or '-'}")
        self.publish()

    def wait_then(self, pending: Pending) -> None:
        """Set the one pending timer (the tick carries it out when due)."""
        self.pending = pending
        self.publish()

    def persist(self) -> None:
        inhand, names = self.inhand, tuple(r.name for r in self.settings.ladder)
        saved = Persisted(
            self.marker, self.ladder, names, inhand.open_incident, self.server.saved_record(), self.stopped_by_request,
            inhand.decided, last_incident=inhand.last_incident,
        )  # fmt: skip
        try:
            save(self.state_dir / "state.json", saved)
            self.persisted_at = self.clock.monotonic()
        except OSError as err:
            self.counters.state_write_errors += 1
            self.record("state_save_failed", "error", error=str(err))

    def unique_incident_id(self, cause: str) -> str:
        diagnostics = self.settings.state_dir / "diagnostics"
        return unique_incident_id(self.clock.wall(), cause, self.inhand.incident_ids, diagnostics)

    # ---- observing and publishing ---------------------------------------------------------

    async def observe(self) -> Observation:
        server, st = self.server, self.lifecycle.state
        look = self.warm.in_force(self.settings.watchdog) if st == State.STARTING else None  # the verdict's window
        obs, lines = await server.observe(
            self.observer, marker=self.marker, serving=st in SERVING, metrics=self._metrics_on[self.ladder.current],
            look=look, now=self.clock.monotonic(),
        )  # fmt: skip
        self.warm.lines(lines)
        if obs.health is not None:
            self.metrics.health(obs.health.latency_s, obs.health.ok)
        pids = obs.tree.pids if server.child is not None else ()
        if pids and self.shm_ledger.due(pids):
            await asyncio.to_thread(self.shm_ledger.note, pids, self.settings.restart.shm_dir)
        return obs

    def publish(self) -> None:
        write_errors = self.write_tally.view(
            self.journal.write_errors, self.server.log_write_errors(), self.counters.state_write_errors,
            self.bundles.write_errors,
        )  # fmt: skip
        facts = gather(
            now=self.clock.monotonic(), wall=self.clock.wall(), lifecycle=self.lifecycle, reason=self.reason,
            since_wall=self.since_wall, settings=self.settings, ladder=self.ladder, server=self.server,
            counters=self.counters, inhand=self.inhand, pending=self.pending, observer=self.observer,
            selfcheck=self.selfcheck.checks, write_errors=write_errors, last_stop=self.last_stop, version=self.version,
        )  # fmt: skip
        self._snapshot = build(facts)
        if self.xids.recent or self.xids.blocked is not None:
            update = {"gpu_xids": self.xids.views(), "gpu_blocked": self.xids.blocked_reason()}
            self._snapshot = self._snapshot.model_copy(update=update)
        self._snapshot = self.peers.publish(self._snapshot)  # a group's part of /status
        self._snapshot = self.warm.publish(self._snapshot)  # launch_timeline, stall_window, outages
        self.write_tally.count(self._snapshot.write_errors)
        if self.recorder.notify_tally.views():
            self._snapshot = self._snapshot.model_copy(update={"notifications": self.recorder.notify_tally.views()})
        for listener in self.publish_listeners:
            with contextlib.suppress(Exception):  # a view's bug must not cost a poll
                listener(self._snapshot)

    # ---- launch -----------------------------------------------------------------------------

    async def launch(self, rung_index: int, *, after_incident: bool, by_group: bool = False) -> None:
        rung = self.settings.ladder[rung_index]
        # A group's member launches only the rung its leader gives (by_group: the leader asked).
        cleared = await self.peers.clearance(rung.name, by_group)
        given = self.settings.rung_index(cleared.rung) if cleared.rung is not None else None
        if given is None:
            why = cleared.why or f"the group's leader gave rung {cleared.rung!r}, which this node's ladder lacks"
            self.defer_launch(rung_index, after_incident, max(0.5, self.settings.watchdog.poll_interval_s), why, None)
            return
        rung_index, rung = given, self.settings.ladder[given]
        await self.peers.launch(rung.name)  # the members it stopped launch it too
        rendered = render_rung(self.settings.server, rung)
        if (blocked := self.xids.blocked_reason()) is not None and self.lifecycle.state != State.STOPPED:
            self.record("launch_refused", "error", rung=rung.name, reason=blocked)
            self.move(State.FAILED, blocked)
            return
        srv = self.settings.server
        holder = await port_holder_of(srv.host, srv.port)
        markers = (self.marker, marker_for(self.state_dir))  # an older version saved another marker
        why = f"port {srv.port} is held by a leftover (this state directory's, or a dead daemon's: its lock is free)"
        if holder is not None and await stopping.sweep(self.stop_tools(), markers, self.record, why):
            # a live daemon's tree, or one whose daemon cannot be found, is kept (supervisor.process.owners)
            holder = await port_holder_of(srv.host, srv.port)
        if holder is not None:
            self.counters.port_refusals += 1
            delay = recovery.port_refused(self.counters.port_refusals, self.settings.restart, self.rand()).delay_s
            why = f"port {srv.port} is held by {holder}: not launching rung {rung.name}; next try in {delay:.1f} s"
            self.defer_launch(rung_index, after_incident, delay, why, "port_busy", port=srv.port, holder=holder)
            return
        self.counters.port_refusals = 0
        self.pending = None
        env = child_env(self.settings, self.env, rendered.env)
        env[STATE_DIR_ENV] = str(self.state_dir.resolve())  # whose the tree is (supervisor.process.owners)
        tree = (
            set(self.server.obs.tree.pids) if self.server.obs is not None and self.server.child is not None else set()
        )
        clean = await slate.prepare(
            self.stop_tools(),
            shm_dir=self.settings.restart.shm_dir,
            state_dir=self.state_dir,
            tree=tree,
            env=child_env(self.settings, self.env, render_rung(srv, self.settings.ladder[self.ladder.current]).env),
            marker=self.marker,
            argv=rendered.argv,
            slate=self.settings.slate,
            engine=profile_of(self.settings.engine_of(rung)),
        )
        if clean.doc:
            self.record("clean_slate", "warning" if clean.warn else "info", **clean.doc)
        if clean.refused is not None:
            self.gpu_refused(rung_index, after_incident, clean.refused, strict=clean.strict)
            return
        self.counters.gpu_refusals = 0
        self.ladder = record_launch(
            self.ladder, rung_index, rung.name, self.clock.wall(), after_incident=after_incident
        )
        self.stopped_by_request = False
        self.inhand.decided = None  # carried out
        self.marker = marker_for(self.state_dir)  # any earlier tree is stopped: new trees carry the derived marker
        if after_incident:
            self.counters.restarts += 1
        self.persist()
        launched_wall = self.clock.wall()
        self.observer.reset(self.engine())  # a new server: nothing the previous one showed carries over
        self.server = Server.fresh(self.clock.monotonic(), launched_wall, before=self.server)
        env.update(await self.warm.launching(rendered.argv, rung.name, env, self.clock.monotonic(), launched_wall))
        request = SpawnRequest(
            rendered.argv, env, self.marker, srv.cwd, log_files(self.settings), self.settings.logs.memory_lines,
            rung.name, launched_wall,
        )  # fmt: skip
        failed = await self.server.spawn(self.control, request, self.clock)
        if failed is not None:
            self.record("spawn_failed", "error", rung=rung.name, error=failed.error)
            self.move(State.STARTING, f"launching rung {rung.name}")
            self.cannot_launch(failed.error)
            return
        self.recorder.rebind(rung=self.current_rung_name(), pid=self.server.pid)
        self.persist()  # from here on a successor daemon can adopt this server
        # argv and env may carry secrets (--api-key, tokens in URLs): logs and the journal get them redacted.
        shown = Redactor.from_envs([env]).argv(rendered.argv)
        start = self.server.capture.start_position if self.server.capture is not None else None
        log_start = None if start is None else {"inode": start.inode, "offset": start.offset}
        self.record(
            "server_launched", rung=rung.name, engine=self.engine().name, pid=self.server.pid, argv=list(shown),
            log_start=log_start,
        )  # fmt: skip
        self.move(State.STARTING, f"launched rung {rung.name}")

    def gpu_refused(self, rung_index: int, after_incident: bool, refused: str, *, strict: bool) -> None:
        """Processes outside the server hold GPU memory ([slate] gpu_strangers, policy/gpufit.py):
        wait on the refused-launch backoff, told once (`launch_blocked`) when the backoff reaches
        its cap; or, strictly, `failed` now."""
        rung = self.settings.ladder[rung_index].name
        self.counters.gpu_refusals += 1
        rand = 0.0 if strict else self.rand()  # drawn only for a backoff
        refusal = recovery.gpu_refused(self.counters.gpu_refusals, self.settings.restart, rand, strict=strict)
        if refusal.fail:
            why = f"{refused}: not launching rung {rung}"
            self.record("launch_refused", "error", rung=rung, reason=why, gpu=refused)
            self.metrics.launch_refused("gpu_held")
            if self.lifecycle.state not in (State.RESTARTING, State.FAILED):
                self.move(State.RESTARTING, why)
            self.fail(why, why)
            return
        why = f"{refused}: not launching rung {rung}; next try in {refusal.delay_s:.1f} s"
        self.defer_launch(rung_index, after_incident, refusal.delay_s, why, "gpu_held", gpu=refused)
        if refusal.tell_blocked:
            self.record("launch_blocked", "error", rung=rung, reason=refused, refusals=self.counters.gpu_refusals)

    def defer_launch(
        self, rung_index: int, after_incident: bool, delay: float, reason: str, refusal: str | None, **fields: object
    ) -> None:
        """A launch refused now (`refusal`: the `launches_refused_total` reason): journalled, counted,
        and tried again after `delay` through the one pending timer the tick advances. With no
        `refusal`, a group's member its leader has not cleared: it asks again each poll, and journals
        `group_launch_held` when the reason changes (not on every ask)."""
        rung = self.settings.ladder[rung_index].name
        if refusal is None:
            if reason != self.reason:
                self.record("group_launch_held", "warning", rung=rung, reason=reason)
        else:
            self.record("launch_refused", "error", rung=rung, reason=reason, **fields, backoff_s=round(delay, 3))
            self.metrics.launch_refused(refusal)
        if self.lifecycle.state != State.RESTARTING:
            self.move(State.RESTARTING, reason)
        self.reason = reason
        self.wait_then(Pending("launch", rung_index, self.clock.monotonic() + delay, after_incident))

    def cannot_launch(self, why: str) -> None:
        """The command cannot be executed at all (missing program or interpreter, permission denied):
        a configuration failure. Every rung runs the same program, so walking the ladder would only
        fail the same way; `failed` at once, with the reason, and the cooldown (if any) still applies."""
        view = IncidentView(
            id=self.unique_incident_id("exited"),
            cause="exited",
            at=iso(self.clock.wall()) or "",
            rung=self.current_rung_name(),
            detail=why[:500],
        )
        self.book_incident(view)
        self.ladder = record_end(self.ladder, "exited", self.clock.wall())
        self.persist()
        self.fail(f"configuration: {why} (fix it, then: sglang-supervisor start)", why)

    def fail(self, reason: str, cooldown_reason: str) -> None:
        """`failed`; with `failed_cooldown_s`, the pending timer starts again from the preferred rung."""
        self.move(State.FAILED, reason)
        cooldown = self.settings.restart.failed_cooldown_s
        if cooldown > 0:
            self.record("failed_cooldown", only="journal", retry_in_s=cooldown, reason=cooldown_reason)
            self.wait_then(Pending("leave_failed", 0, self.clock.monotonic() + cooldown))

    async def leave_failed(self, event: EventName, why: str, rung: int) -> None:
        """Out of `failed` (cooldown over, or by hand): fresh retry, backoff and budget counters."""
        self.ladder = fresh_start(self.ladder)
        self.record(event, reason=why, rung=self.settings.ladder[rung].name)
        await self.launch(rung, after_incident=False)

    # ---- incidents ----------------------------------------------------------------------------

    async def incident(
        self,
        cause: Cause,
        verdict: Verdict | None,
        obs: Observation | None,
        *,
        forced_rung: int | None = None,
        group_why: str = "",
        diagnose: bool = True,
        incident_id: str | None = None,
        requested: bool = False,
    ) -> None:
        """`requested`: an operator's restart or promote (its stop is not the daemon's share)."""
        incident_id = incident_id or self.unique_incident_id(cause)
        self.warm.incident(incident_id, cause, verdict, self.clock.monotonic(), requested=requested)  # the outage
        alive = obs is not None and obs.tree.root_alive and bool(obs.tree.processes)
        captures = diagnose and alive and obs is not None and cause in HUNG_CAUSES | {"manual", "spec_regression"}
        if diagnose and not captures:  # no bundle of its own: a group's members still take theirs
            await self.peers.capture_alone(incident_id)
        self.recorder.bind(incident=incident_id)  # its capture, stop and decision name it
        hang_class = provisional_class(verdict)
        bundle_id: str | None = None
        culprit: str | None = None
        keeper = self.server.describe_keeper()
        if keeper and verdict is not None:  # the server blocked on its output: name who stopped reading it
            verdict = replace(verdict, reason=f"{verdict.reason}; {keeper}")
        self.xids, detail, named = xids.explain(
            self.xids, self.clock.wall(), verdict.reason if verdict is not None else ""
        )
        if named:  # the relaunch after a GPU fault keeps the configured start-up window (issue 36)
            self.warm.gpu_fault(self.clock.wall() - min(e.at for e in named))
        self.record(
            "incident", "warning", only="log", id=incident_id, cause=cause, reason=detail, rung=self.current_rung_name()
        )
        if captures and obs is not None:
            if cause in HUNG_CAUSES:
                self.move(State.HUNG, detail)
            self.move(State.DIAGNOSING, f"capturing evidence for {incident_id}")
            self.inhand.open_incident = OpenIncident(incident_id, cause, self.current_rung_name(), self.clock.wall())
            self.persist()
            try:
                trigger = "hung" if cause in HUNG_CAUSES else "manual"
                own = self.capture_bundle(incident_id, trigger, cause, obs, verdict)
                result = await self.peers.capture(incident_id, own)
            finally:
                self.inhand.open_incident = None
            if result is not None:
                bundle_id = result.id if result.path is not None else None
                culprit = culprit_text(result.summary)
                if result.hang_class not in ("unknown", "") or hang_class is None:
                    hang_class = result.hang_class if cause in HUNG_CAUSES else hang_class
        self.warm.evidence_done(self.clock.monotonic())
        view = IncidentView(
            id=incident_id,
            cause=cause,
            hang_class=hang_class,
            at=iso(self.clock.wall()) or "",
            rung=self.current_rung_name(),
            detail=detail[:500],
            bundle=bundle_id,
            culprit=culprit,
        )
        self.book_incident(view, **({"xids": xids.as_records(named)} if named else {}))
        incident = Incident(cause, hang_class, gpu_fault=bool(named), group_why=group_why)
        await self.recover(incident, forced_rung=forced_rung, manual=cause == "manual")
        self.recorder.unbind("incident")  # a relaunch has already bound its own context

    def book_incident(self, view: IncidentView, **extra: object) -> None:
        """One incident on the books: counted, shown as the last one, journalled (the counter by
        cause and hang class subscribes to that line)."""
        self.counters.incidents += 1
        self.inhand.last_incident = view
        self.record("incident", only="journal", **view.model_dump(), **extra)

    async def capture_bundle(
        self,
        incident_id: str,
        trigger: str,
        cause: str | None,
        obs: Observation,
        verdict: Verdict | None,
        *,
        native: bool | None = None,
        gdb: bool | None = None,
    ) -> BundleResult | None:
        """A bundle of the current server (`supervisor.daemon.evidence.Bundles` writes and tells it)."""
        self.inhand.diagnosing = True
        self.publish()
        rendered = render_rung(self.settings.server, self.settings.ladder[self.ladder.current])
        server = self.server
        try:
            gpu_all = await asyncio.to_thread(self.observer.gpu.snapshot_all)
            return await self.bundles.take(
                incident_id,
                trigger,
                collect(
                    settings=self.settings,
                    incident_id=incident_id,
                    trigger=trigger,
                    cause=cause,
                    obs=obs,
                    verdict=verdict,
                    rendered=rendered,
                    env=child_env(self.settings, self.env, rendered.env),  # what the server got; redacted
                    log_tail=server.log_tail(self.settings.diagnostics.log_tail_lines),
                    gpu_all=gpu_all,
                    cpu_rate=server.history.cpu_rate if server.history is not None else None,
                    native=native,
                    gdb=gdb,
                    hung=trigger == "hung",
                    created_at=self.clock.wall(),
                    gpu_xids=tuple(xids.as_records(list(self.xids.recent))),
                    group=self.peers.bundle_doc(incident_id),
                ),
            )
        finally:
            self.inhand.diagnosing = False

    async def recover(self, incident: Incident, *, forced_rung: int | None, manual: bool) -> None:
        """Stop the server (and a group's members with it), ask the ladder, then relaunch now (no
        backoff) or set the pending timer. `[group] restart = "lws"` on the leader: the ladder decides
        first (as after a verified stop) and the decision is saved before the exit, so the recreated
        group starts on the decided rung and the hourly budget counts (issue 34); out of rungs, or a
        launch blocked, there is no exit (a recreation would run into the same end): the group is
        stopped and failed here."""
        g = self.settings.group
        if g is not None and recovery.exits_for_group(g.is_leader, g.restart):
            early = self._after_incident(incident, True, manual, forced_rung, self.clock.wall())
            if not isinstance(early, recovery.Failed) and early.decision.action == "relaunch":
                self.decided(incident, early, self.clock.wall())  # saved: the recreated leader resumes it
                self.peers.exits_for_group()
                self.leaving = "group_restart"
                self.persist()
                return  # LWS recreates the group, on the rung just decided and saved
        if self.lifecycle.state != State.RESTARTING:
            self.move(State.RESTARTING, f"stopping after {incident.cause}")
        rs = self.settings.restart  # a hung tree's graceful exit cannot come: a short grace (issue 36)
        grace = min(rs.stop_grace_s, rs.hung_stop_grace_s) if incident.cause in HUNG_CAUSES else None
        ok = await self.peers.stop(self.stop_server(f"incident {incident.cause}", grace_s=grace))
        self.warm.stopped(self.clock.monotonic())
        now_wall = self.clock.wall()
        outcome = self._after_incident(incident, ok, manual, forced_rung, now_wall)
        if isinstance(outcome, recovery.Failed):
            self.move(State.FAILED, outcome.reason)
            return
        decision = self.decided(incident, outcome, now_wall)
        if decision.action == "give_up":
            self.fail(decision.reason, decision.reason)
            return
        self.reason = decision.reason
        now = self.clock.monotonic()
        wait = self.warm.backoff_left(decision.backoff_s, now)  # counted from the verdict (issue 36)
        if wait <= 0:
            await self.launch(decision.rung, after_incident=not manual)
            return
        self.wait_then(Pending("launch", decision.rung, now + wait, not manual))

    def _after_incident(
        self, incident: Incident, released: bool, manual: bool, forced_rung: int | None, now_wall: float
    ) -> recovery.Failed | recovery.Recovery:
        """The ladder's pure decision after a stop, for a relaunch here or an LWS recreation."""
        # rand is for the ladder's backoff (next_rung); a manual restart or a rung asked for needs none
        rand = self.rand() if not manual and forced_rung is None else 0.0
        after = recovery.AfterStop(released=released, xid_blocked=self.xids.blocked_reason())
        return recovery.after_incident(
            self.settings.ladder, self.ladder, incident, after, self.settings.restart, manual=manual,
            forced_rung=forced_rung, now_wall=now_wall, rand=rand, speculative=self._speculative,
        )  # fmt: skip

    def decided(self, incident: Incident, outcome: recovery.Recovery, now_wall: float) -> Decision:
        """The ladder's decision taken: counted, saved before any backoff (a successor relaunches this
        rung), journalled."""
        self.ladder, decision = outcome.ladder, outcome.decision
        self.metrics.restart(incident.cause)  # manual restarts count too (cause "manual")
        if decision.action == "relaunch":
            name = self.settings.ladder[decision.rung].name
            self.inhand.decided = Decided(name, decision.reason, now_wall + decision.backoff_s)
        self.persist()
        fields = {"action": decision.action, "rung": decision.rung, "reason": decision.reason}
        self.record("ladder_decision", **fields, backoff_s=round(decision.backoff_s, 3))
        return decision

    # ---- stop -------------------------------------------------------------------------------

    async def stop_server(self, why: str, *, grace_s: float | None = None) -> bool:
        """Stop the tree, verify the port and GPU memory are free, empty the server. True when verified.
        `grace_s`: the SIGTERM grace, when not `stop_grace_s` (a tree judged hung)."""
        tools = self.stop_tools() if grace_s is None else replace(self.stop_tools(), grace_s=grace_s)
        stopped = await self.server.stop(tools, self.marker, why)
        self.recorder.bind(pid=None)  # no server from here on
        self.last_stop = stopped.view
        self.record("server_stopped", "info" if stopped.ok else "error", **stopped.doc)
        return stopped.ok

    async def shutdown(self) -> None:
        self.notifier.stopping()
        if self.server.child is not None or self.lifecycle.state in RUNNING:
            try:
                if self.lifecycle.state != State.RESTARTING:
                    self.move(State.RESTARTING, "daemon shutting down")
                await self.stop_server("daemon shutdown")
            except Exception:
                self.record("shutdown_stop_failed", "exception", only="log")
        if self.lifecycle.state != State.STOPPED:
            self.move(State.STOPPED, "daemon shut down")
        self.ladder = record_end(self.ladder, "daemon_shutdown", self.clock.wall())
        if self.leaving != "handoff":  # a service stop: the next service start starts the server again
            self.stopped_by_request = False
        self.persist()
        await self.observer.close()
        await self.bundles.close()  # an analyzer still running goes with its child
        fail_queued(self.queue, "daemon shut down", State.STOPPED.value)

    # ---- the tick's watch over a running server ------------------------------------------
    # One step each: drain the Xid watcher, reap orphans, tend the log keeper, observe, let the
    # pure watchdog (`supervisor.policy.watchdog.assess`) judge, act on the verdict.

    async def tend_keeper(self) -> None:
        """The server's log keeper, every poll: a dead one is replaced on the same pipe (no server
        restart, no line lost), a stopped one is named; each change is journalled once."""
        now = await self.server.tend_keeper(self.control, log_files(self.settings))
        if now is not None and now.condition in ("replaced", "stopped", "lost"):
            self.counters.keepers_replaced += now.condition == "replaced"
            event, level, fields = Server.keeper_news(now)
            self.record(event, level, **fields)

    async def watch(self) -> None:
        """Observe the running server, let it judge itself by the window in force, act on the verdict."""
        obs = await self.observe()
        server = self.server
        if server.unseen(obs):
            self.counters.unknown_observations += 1
            self.record("observation_unknown", "warning", only="log", count=self.counters.unknown_observations)
            self.publish()
            return
        mode: Mode = "serving" if self.lifecycle.state in SERVING else "starting"
        wd = self.settings.watchdog
        if mode == "starting" and server.history is not None:  # the phase's learned window (issue 36)
            wd = self.warm.window(obs, server.history, wd)
        spec = self._speculative[self.ladder.current]
        verdict = server.judge(obs, wd, mode=mode, speculative=spec, now=self.clock.monotonic())
        await self.act(verdict, obs)
        # Every LOG_POSITION_SAVE_S, the log position a successor resumes from (it re-reads at most that).
        if self.clock.monotonic() - self.persisted_at >= LOG_POSITION_SAVE_S and server.log_moved():
            self.persist()
        self.publish()

    async def act(self, verdict: Verdict, obs: Observation) -> None:
        """Act on the verdict a group's peers leave (a worker holds its incident for the leader)."""
        judged = self.peers.judge(verdict, self.lifecycle.state.value)
        if judged.hold:
            self.move(State.HUNG, judged.hold)
        elif (v := judged.verdict) is not None and judged.same_rung and v.is_incident and v.cause is not None:
            # A group incident the servers did not cause (`same_rung` says why): relaunched on the rung.
            await self.incident(v.cause, v, obs, forced_rung=self.ladder.current, group_why=judged.same_rung)
        elif (v := judged.verdict) is None:
            return
        elif v.is_incident:
            assert v.cause is not None
            await self.incident(v.cause, v, obs)
        elif self.lifecycle.state == State.STARTING:
            if v.status == "ready":
                self.mark_ready()
            else:
                self.reason = v.reason
        else:
            await self.act_serving(v, self.clock.monotonic())

    def mark_ready(self) -> None:
        now, rung = self.clock.monotonic(), self.current_rung_name()
        ready = self.server.became_ready(now)
        self.observer.mark_serving()  # vLLM prints no ready line; an adopted server printed it long ago
        self.ladder = record_ready(self.ladder, self.clock.wall())
        self.persist()
        if ready.adopted:
            self.record("server_ready", only="journal", rung=rung, adopted=True, takeover_s=ready.takeover_s)
            self.move(State.READY, f"adopted server ready on rung {rung}")
            return
        self.record("server_ready", only="journal", rung=rung, time_to_ready_s=ready.time_to_ready_s)
        self.move(State.READY, f"ready on rung {rung} in {ready.time_to_ready_s:.1f} s")

    async def act_serving(self, v: Verdict, now: float) -> None:
        st, server = self.lifecycle.state, self.server
        if v.cause == "spec_regression":
            if self.settings.watchdog.on_spec_regression == "fallback":
                await self.incident("spec_regression", v, server.obs)
                return
            if server.first_spec_alert():
                self.counters.incidents += 1  # counted as an incident, kept out of the last one
                self.record("spec_regression", only="journal", reason=v.reason, rung=self.current_rung_name())
        if v.status == "degraded" and st == State.READY:
            self.move(State.DEGRADED, v.reason)
        elif v.status == "ready" and st == State.DEGRADED:
            server.spec_recovered()
            self.move(State.READY, "recovered")
        elif v.status == "degraded":
            self.reason = v.reason
        ready = self.lifecycle.state == State.READY
        step = server.serving_step(self.settings.restart, now=now, rung=self.ladder.current, ready=ready)
        if step.stable:
            self.ladder = record_stable(self.ladder)
            self.persist()
            self.record("server_stable", only="journal", rung=self.current_rung_name())
        if step.promote:
            top = self.settings.ladder[0].name
            self.record("promotion", only="journal", from_rung=self.current_rung_name(), to_rung=top)
            v = Verdict(status="incident", cause="manual", reason="promotion")
            await self.incident("manual", v, server.obs, forced_rung=0, diagnose=False)

    # ---- commands: one validation, one dispatcher, one method per kind ---------------------

    def check(self, cmd: Command, *, queued: bool) -> CommandResult | None:
        """The one validation (`supervisor.policy.validation.check`), at submit and in the queue."""
        inhand = self.inhand
        early = validation.check(
            cmd,
            state=self.lifecycle.state,
            settings=self.settings,
            restart_pending=inhand.restart_pending,
            diagnosing=inhand.diagnosing,
            queued=queued,
        )
        if early is None and (why := self.peers.refuses_command(cmd)) is not None:
            return CommandResult("conflict", why, self.lifecycle.state.value)
        return early

    async def submit(self, command: Command) -> CommandResult:
        early = self.check(command, queued=False)
        if early is not None:
            return early
        fut: asyncio.Future[CommandResult] = asyncio.get_running_loop().create_future()
        if command.kind == "restart":
            self.inhand.restart_pending = True
        if command.kind == "diagnose":
            self.inhand.diagnosing = True
        await self.queue.put(Command(**{**command.__dict__, "done": fut}))
        return await fut

    async def handle(self, cmd: Command) -> None:
        """The one dispatcher: `check`, journal, then `handle_<kind>`; a failure never ends the loop."""
        try:
            early = self.check(cmd, queued=True)
            if early is not None:
                finish(cmd, early)
                return
            self.record(
                "command",
                only="journal",
                kind=cmd.kind,
                rung=cmd.rung,
                reason=cmd.reason,
                source=cmd.source,
                requested_by=cmd.requested_by or None,
            )
            await getattr(self, f"handle_{cmd.kind}")(cmd)
        except Exception as err:  # a command must never kill the loop
            finish(cmd, CommandResult("failed", f"{cmd.kind} failed: {err!r}", self.lifecycle.state.value))
            await self.survive(err)
        finally:
            if cmd.kind == "restart":
                self.inhand.restart_pending = False
            if cmd.kind == "diagnose":
                self.inhand.diagnosing = False
            self.publish()

    async def handle_shutdown(self, cmd: Command) -> None:
        # no server during a backoff: nothing to hand over, still exit 75
        self.leaving = "handoff" if cmd.kind == "handoff" else "shutdown"
        finish(cmd, CommandResult("accepted", "shutting down", self.lifecycle.state.value))

    handle_handoff = handle_shutdown

    async def handle_stop(self, cmd: Command) -> None:
        """A stop on a group's leader stops the group; its next launch launches every node again."""
        if self.server.child is None and self.pending is not None:  # waiting to launch: nothing runs
            self.ladder = record_end(self.ladder, "stopped", self.clock.wall())
            self.stopped_by_request = True
            self.persist()
            self.move(State.STOPPED, cmd.reason or "stopped by request during backoff")
            finish(cmd, CommandResult("done", "stopped", State.STOPPED.value))
            return
        finish(cmd, CommandResult("accepted", "stopping", self.lifecycle.state.value))
        self.move(State.RESTARTING, cmd.reason or "stop requested")
        stop = self.stop_server("stop requested")
        await (stop if cmd.source == "group" else self.peers.stop(stop))
        self.ladder = record_end(self.ladder, "stopped", self.clock.wall())
        self.stopped_by_request = True
        self.persist()
        self.move(State.STOPPED, cmd.reason or "stopped by request")

    async def handle_start(self, cmd: Command) -> None:
        target = validation.target_rung(cmd, self.settings, self.lifecycle.state, self.pending, self.ladder.current)
        by_group = cmd.source == "group"  # the group's leader launches this node: no need to ask it
        if self.pending is not None and self.pending.what != "leave_failed":  # skip the wait, keep the rung
            finish(cmd, CommandResult("accepted", "relaunching now", self.lifecycle.state.value))
            await self.launch(target, after_incident=False, by_group=by_group)
            return
        finish(cmd, CommandResult("accepted", "starting", self.lifecycle.state.value))
        self.xids, note = xids.unblock(self.xids)
        if note is not None:
            self.record(note.event, **note.fields)
        if self.lifecycle.state == State.FAILED:
            await self.leave_failed("failed_left", "start requested", target)
        else:
            await self.launch(target, after_incident=False, by_group=by_group)

    async def handle_restart(self, cmd: Command) -> None:
        hint = f"manual restart to {cmd.rung or self.current_rung_name()}"
        st = self.lifecycle.state
        if st in (State.STOPPED, State.FAILED) or self.server.child is None:
            finish(cmd, CommandResult("accepted", hint, st.value))
            target = validation.target_rung(cmd, self.settings, self.lifecycle.state, self.pending, self.ladder.current)
            if st == State.FAILED:
                self.move(State.RESTARTING, cmd.reason or "restart requested")
                await self.leave_failed("failed_left", cmd.reason or "restart requested", target)
            else:
                await self.launch(target, after_incident=False)
            return
        # Answer at once with the incident's id; the restart itself takes minutes.
        pending_id = self.unique_incident_id("manual")
        finish(cmd, CommandResult("accepted", hint, st.value, incident_id=pending_id))
        idx = self.settings.rung_index(cmd.rung) if cmd.rung else None
        v = Verdict(status="incident", cause="manual", reason=cmd.reason or "restart requested")  # asked for
        await self.incident(
            "manual", v, self.server.obs, forced_rung=idx, diagnose=cmd.diagnose, incident_id=pending_id, requested=True
        )

    async def handle_diagnose(self, cmd: Command) -> None:
        """A bundle now. The group leader's `POST /group/capture` asks for one under its incident id,
        as for a hang (the group is hung, if not this node), even with no process left (the log and
        the GPUs still tell)."""
        asked = self.peers.asked(cmd)
        obs = self.server.obs if self.server.obs is not None else await self.observe()
        if asked is not None and cmd.incident_id is not None:
            kept = kept_bundle(self.settings.state_dir / "diagnostics", cmd.incident_id)
            if kept is not None:  # asked again for one incident (a successor leader): one bundle per node
                st = self.lifecycle.state.value
                finish(cmd, CommandResult("done", "captured before", st, bundle_id=cmd.incident_id, summary=kept))
                return
            if self.lifecycle.state in SERVING and obs.logs.phase != "serving":
                # A worker node logs no ready line (SGLang starts no HTTP server there): its log's
                # last phase is start-up's, but it was serving; its bundle says its own phase (issue 34).
                obs = replace(obs, logs=replace(obs.logs, phase="serving"))
            result = await self.capture_bundle(cmd.incident_id, "hung", asked.cause, obs, None)
            finish(cmd, answer_of(result, self.lifecycle.state.value))
            return
        if not obs.tree.processes:
            finish(cmd, CommandResult("invalid", "no server process to diagnose", self.lifecycle.state.value))
            return
        trigger = "hung" if self.lifecycle.state == State.HUNG else "manual"
        incident_id = self.unique_incident_id("diagnose")
        result = await self.capture_bundle(incident_id, trigger, None, obs, None, native=cmd.native, gdb=cmd.gdb)
        finish(cmd, answer_of(result, self.lifecycle.state.value))

    async def handle_reload(self, cmd: Command) -> None:
        """SIGHUP: re-read the config; an invalid one is refused and the old one stays in force."""
        if self.config_path is None:
            finish(cmd, CommandResult("invalid", "no config file to reload", self.lifecycle.state.value))
            return
        self.notifier.reloading()
        try:
            new = await asyncio.to_thread(load_settings, self.config_path)
            if (refused := self.peers.refuses_reload(new, self.settings)) is not None:
                raise ConfigError(refused)
            validation.refuse_restart_only_changes(self.settings, new)
            if self.on_reload is not None:
                await self.on_reload(new)
        except ConfigError as err:
            self.record("config_reload_refused", "error", error=str(err))
            finish(cmd, CommandResult("invalid", str(err), self.lifecycle.state.value))
        else:  # thresholds and ladder change without touching a healthy server
            old_names = tuple(r.name for r in self.settings.ladder)
            self.settings = self.warm.settings = new
            self.observer.configure(new)
            self.observer.gpu.scope = DeviceScope.for_server(new.server.env, self.env)  # CUDA_VISIBLE_DEVICES
            self.ladder = remap(self.ladder, old_names, tuple(r.name for r in new.ladder))
            self.persist()
            self.record("config_reloaded", ladder=[r.name for r in new.ladder])
            self.publish()
            await self.selfcheck.refresh(self.settings, self.observer)  # new tool paths, a tool installed
            finish(cmd, CommandResult("done", "reloaded", self.lifecycle.state.value))
        finally:
            self.notifier.ready()

    # ---- the loop -------------------------------------------------------------------------

    async def run(self, *, autostart: bool = True) -> None:
        """Start (resuming the ladder), then poll until a shutdown command; always stop the tree.
        A group's leader polls its members beside the loop (`Peers.start`) until the loop ends."""
        await self.peers.start(lambda: self.settings.watchdog.poll_interval_s, self.clock.sleep)
        try:
            try:
                try:
                    await self.startup(autostart)
                except Exception as err:  # not even start-up may end the daemon
                    await self.survive(err)
                    if autostart and self.lifecycle.state == State.STOPPED and not self.stopped_by_request:
                        # Start-up failed before the first launch: the tick tries it after `backoff_initial_s`.
                        delay = self.settings.restart.backoff_initial_s
                        rung = resume_rung(self.ladder, len(self.settings.ladder), self.settings.restart.start_from)
                        self.move(State.RESTARTING, f"start-up failed ({err!r}); launching in {delay:g} s")
                        self.wait_then(Pending("launch", rung, self.clock.monotonic() + delay))
                next_tick = self.clock.monotonic()
                while self.leaving is None:
                    wake = next_tick if self.pending is None else min(next_tick, self.pending.at)
                    try:
                        cmd = await self.next_command(max(0.0, wake - self.clock.monotonic()))
                        if cmd is not None:
                            await self.handle(cmd)
                            continue
                        now = self.clock.monotonic()
                        # A late poll (the daemon itself starved) must not eat the server's stall window.
                        self.observer.loop_lag_s = max(0.0, now - next_tick)
                        next_tick = now + self.settings.watchdog.poll_interval_s
                        await self.tick()
                    except Exception as err:  # the loop outlives any one poll, probe, write or command
                        await self.survive(err)
            finally:
                if self.leaving == "handoff" and self.server.child is not None and self.server.record is not None:
                    await self.hand_over()  # SIGUSR2: the server stays for the successor
                else:
                    await self.shutdown()
        finally:
            await self.peers.close()

    async def startup(self, autostart: bool) -> None:
        srv, api = self.settings.server, self.settings.api
        # who holds this state directory's lock, for a daemon that meets this one's tree on its port
        about = (self.state_dir, self.config_path, (srv.host, srv.port), (api.host, api.port))
        await asyncio.to_thread(instance_lock.write_about, *about)
        await self.selfcheck.refresh(self.settings, self.observer)
        names = tuple(r.name for r in self.settings.ladder)
        saved, why = load(self.state_dir / "state.json", names)
        if saved is not None:
            self.marker, self.ladder = saved.marker, saved.ladder
            self.server.restore(saved.server)
            self.stopped_by_request = saved.stopped
            self.inhand.decided = saved.decided
            self.inhand.last_incident = saved.last_incident  # `status` keeps the why across a daemon restart
        rung = names[self.ladder.current]
        self.record("state_loaded", only="log", detail=why, rung=rung, last_good=self.ladder.last_good)
        self.record("daemon_started", only="journal", version=self.version, state=why, rung=rung)
        if saved is not None and saved.open_incident is not None:
            await self.finish_interrupted(saved.open_incident)
        self.persist()
        not_adopted = why_not_adopted(saved, why)
        if saved is None or saved.open_incident is None:
            if await self.adopt_server():
                self.publish()
                return
        else:  # the predecessor had judged this server and was stopping it: its verdict stands
            if (record := self.server.forget()) is not None:  # whatever carries the marker is stopped
                self.record("adoption_refused", "warning", pid=record.pid, reason=not_adopted)
        await stopping.sweep(self.stop_tools(), (self.marker, marker_for(self.state_dir)), self.record, not_adopted)
        # The previous daemon's server, if any, was just stopped: its attempt ends here.
        self.ladder = record_end(self.ladder, "daemon_restarted", self.clock.wall())
        decided = self.inhand.decided
        first = recovery.at_start(
            self.ladder,
            len(self.settings.ladder),
            self.settings.restart,
            autostart=autostart,
            stopped_by_request=self.stopped_by_request,
            decided_rung=self.settings.rung_index(decided.rung) if decided is not None else None,
            decided_launch_at=decided.launch_at if decided is not None else None,
            now_wall=self.clock.wall(),
        )
        if isinstance(first, recovery.StayStopped):  # the operator's stop outlives the daemon
            self.reason = first.reason
            self.record("stayed_stopped", reason=self.reason)
        elif isinstance(first, recovery.Resume) and decided is not None:
            # A predecessor decided a relaunch and was gone before making it (handoff or crash in
            # the backoff): that decision stands, the rung that just failed is not tried again.
            wait = first.wait_s
            self.record("decision_resumed", rung=decided.rung, reason=decided.reason, backoff_s=round(wait, 3))
            self.move(State.RESTARTING, f"resuming the ladder's decision: {decided.reason}")
            self.wait_then(Pending("resume", first.rung, self.clock.monotonic() + wait, after_incident=True))
        elif isinstance(first, recovery.Launch):
            await self.launch(first.rung, after_incident=False)
        self.publish()

    async def tick(self) -> None:
        """One poll. The pending timer and a restart cut short come first; each step is one call."""
        if self.selfcheck.due():
            await self.selfcheck.refresh(self.settings, self.observer)
        self.xids, notes = xids.drain(self.xids, self.xid_watcher, self.server.obs, self.observer.gpu.scope)
        for note in notes:  # a gpu_xid is counted by its subscriber
            self.record(note.event, note.level, **note.fields)
        if await self.resume_cut_short() or await self.fire_pending():
            return
        # Orphans of the tree re-parented to the daemon (a subreaper) are reaped once they exit.
        await asyncio.to_thread(self.control.reap, self.server.pid)
        await self.tend_keeper()
        if self.lifecycle.state not in RUNNING:
            # Keep reading NVML (and looking for escaped processes by marker) while nothing runs,
            # so GPU gauges never freeze at the last server's values; no tree holds 0.
            await self.observe()
            self.publish()
            return
        await self.watch()

    async def resume_cut_short(self) -> bool:
        """A restart an exception cut short is taken up again as an incident (stop, verify, relaunch)."""
        if not self.inhand.resume_after_error:
            return False
        self.inhand.resume_after_error = False
        if self.lifecycle.state not in RESTART_UNDER_WAY:
            return False
        last = self.inhand.last_incident
        cause = last.cause if last is not None else "exited"
        why = "a restart was interrupted by an internal error"
        await self.incident(cause, Verdict(status="incident", cause=cause, reason=why), None)
        return True

    async def fire_pending(self) -> bool:
        """The one pending timer, when due: launch (a backoff, a deferred launch, a resumed decision)
        or leave `failed` after its cooldown. True when it acted (the tick ends)."""
        p = self.pending
        if p is None or self.lifecycle.state != p.waits_in or self.clock.monotonic() < p.at:
            return False
        self.pending = None
        if p.what == "leave_failed":
            why = "failed_cooldown_s passed: starting again from the preferred rung"
            await self.leave_failed("failed_cooldown_over", why, p.rung)
        else:
            await self.launch(p.rung, after_incident=p.after_incident)
        return True

    # ---- adoption and handover ------------------------------------------------------------

    async def adopt_server(self) -> bool:
        """At start: take over the server a predecessor left running, if it is provably that server.

        Ladder position and attempt stay as saved; probes start afresh and the usual rules judge it
        from `starting` (a serving server is `ready` at the first good health probe). False when
        there is nothing to adopt or it cannot be proven ours (the caller then stops it by marker).
        """
        record = self.server.record
        if record is None:
            return False
        rung = self.settings.rung_index(record.rung)
        server = Server.fresh(self.clock.monotonic(), record.launched_wall, before=self.server)
        server.restore(record)
        files, lines = log_files(self.settings), self.settings.logs.memory_lines
        if (refused := await server.adopt(rung, self.marker, self.control, files, lines, self.clock)) is not None:
            self.server.forget()  # the caller stops whatever carries the marker
            self.record("adoption_refused", "warning", pid=record.pid, reason=refused.why)
            return False
        assert rung is not None
        self.ladder = replace(self.ladder, current=rung)
        self.observer.reset(self.engine())
        self.server = server
        argv = render_rung(self.settings.server, self.settings.ladder[rung]).argv
        self.warm.adopting(argv, record.rung, self.clock.monotonic(), record.launched_wall)
        self.recorder.rebind(rung=self.current_rung_name(), pid=self.server.pid)
        self.persist()
        self.record("server_adopted", pid=record.pid, rung=record.rung, starttime=record.starttime)
        self.move(State.STARTING, f"adopted server pid {record.pid} on rung {record.rung}")
        return True

    async def hand_over(self) -> None:
        """Exit for a successor (an upgrade): the server keeps running, state.json says how to adopt it."""
        self.notifier.stopping()
        await self.server.close_log()  # its position now covers every line read
        self.persist()
        record = self.server.record
        assert record is not None
        self.record("daemon_handoff", pid=record.pid, rung=record.rung, state=self.lifecycle.state.value)
        await self.observer.close()
        fail_queued(self.queue, "daemon handed over to its successor", self.lifecycle.state.value)

    # ---- the daemon's care of itself -------------------------------------------------------

    async def survive(self, err: Exception) -> None:
        """An exception escaped a poll or a command: log it, count it, and leave no half-done restart
        (one cut short is taken up again by the next tick, `resume_cut_short`)."""
        self.counters.loop_errors += 1
        state = self.lifecycle.state.value
        self.record("loop_error", "error", only="log", error=repr(err), state=state, exc_info=err)
        self.metrics.loop_error(type(err).__name__)  # by the exception's type, which no line carries
        self.record("loop_error", only="journal", error=repr(err)[:500], state=state)
        self.inhand.diagnosing = False
        self.publish()
        if self.lifecycle.state in RESTART_UNDER_WAY and self.leaving is None:
            self.inhand.resume_after_error = True

    async def finish_interrupted(self, inc: OpenIncident) -> None:
        """The previous daemon died capturing evidence: the incident is recorded as it stood. A group's
        leader completes its capture under the same id first (issue 34): node 0's bundle is taken now,
        before the old tree is stopped (unless the predecessor wrote it), and every member is asked
        again; a member that wrote its bundle answers with it."""
        g, bundle = self.settings.group, None
        if g is not None and g.is_leader:
            if kept_bundle(self.state_dir / "diagnostics", inc.id) is not None:
                await self.peers.capture_alone(inc.id)
                bundle = inc.id
            else:
                trigger = "hung" if inc.cause in HUNG_CAUSES else "manual"
                own = self.capture_bundle(inc.id, trigger, inc.cause, await self.observe(), None)
                result = await self.peers.capture(inc.id, own)
                bundle = result.id if result is not None and result.path is not None else None
        detail = "capture interrupted" + ("; completed by this daemon" if bundle is not None else "")
        view = IncidentView(
            id=inc.id, cause=inc.cause, at=iso(inc.at) or "", rung=inc.rung, detail=detail, bundle=bundle
        )
        self.book_incident(view, interrupted=True)
        self.record("incident_interrupted", "warning", only="log", id=inc.id, cause=inc.cause, rung=inc.rung)
        self.ladder = record_end(self.ladder, inc.cause, self.clock.wall())
