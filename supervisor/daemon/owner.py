"""The one owner of the supervisor's state: the loop (observe, decide, act, record, once per poll),
the one pending timer it advances, and the one command dispatcher.

Commands (API, signals) arrive on one queue; `check` decides whether one applies now (at submit
and again when its turn comes), and `handle` runs `handle_<kind>`. A command that arrives while a
backoff, a deferred launch or a `failed` cooldown waits goes the same way: waiting is the pending
timer (`records.Pending`), which the loop wakes for and the tick carries out first, never a loop
inside a helper. Start-up adopts a predecessor's server (`takeover`) or sweeps its leftovers; a
handoff leaves the server for a successor. Only this object writes its records; the helpers it
calls (launching, slate, stopping, takeover, evidence, xids) take explicit values and return
outcomes. Adding a command is one `handle_<kind>` method (and its rule in `validation.check`);
adding a step to the tick is one named call in `tick`.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from supervisor.config.settings import ConfigError, load_settings
from supervisor.daemon import takeover, xids
from supervisor.daemon.owner_watch import ServerWatch
from supervisor.daemon.persist import OpenIncident, load
from supervisor.daemon.publish import iso
from supervisor.daemon.records import Pending
from supervisor.diagnostics import self_check
from supervisor.host import instance_lock
from supervisor.policy import validation
from supervisor.policy.ladder import record_end, resume_rung
from supervisor.policy.lifecycle import RESTART_UNDER_WAY, RUNNING, State
from supervisor.policy.watchdog import Verdict
from supervisor.status.commands import Command, CommandResult, finish
from supervisor.status.snapshot import IncidentView


class Supervisor(ServerWatch):
    """Owns the server tree, its lifecycle state and the ladder; the API sees `snapshot`/`submit`."""

    # ---- commands: one validation, one dispatcher, one method per kind ---------------------

    def check(self, cmd: Command, *, queued: bool) -> CommandResult | None:
        """The one validation (`supervisor.policy.validation.check`), at submit and in the queue."""
        inhand = self.inhand
        return validation.check(
            cmd,
            state=self.lifecycle.state,
            settings=self.settings,
            restart_pending=inhand.restart_pending,
            diagnosing=inhand.diagnosing,
            queued=queued,
        )

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
            self.journal.append("command", kind=cmd.kind, rung=cmd.rung, reason=cmd.reason, source=cmd.source)
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
        self.shutdown_requested = True  # no server during a backoff: nothing to hand over, still exit 75
        self.handoff = cmd.kind == "handoff"
        finish(cmd, CommandResult("accepted", "shutting down", self.lifecycle.state.value))

    handle_handoff = handle_shutdown

    async def handle_stop(self, cmd: Command) -> None:
        if self.slot.child is None and self.pending is not None:  # waiting to launch: nothing runs
            self.ladder = record_end(self.ladder, "stopped", self.clock.wall())
            self.stopped_by_request = True
            self.persist()
            self.move(State.STOPPED, cmd.reason or "stopped by request during backoff")
            finish(cmd, CommandResult("done", "stopped", State.STOPPED.value))
            return
        finish(cmd, CommandResult("accepted", "stopping", self.lifecycle.state.value))
        self.move(State.RESTARTING, cmd.reason or "stop requested")
        await self.stop_server("stop requested")
        self.ladder = record_end(self.ladder, "stopped", self.clock.wall())
        self.stopped_by_request = True
        self.persist()
        self.move(State.STOPPED, cmd.reason or "stopped by request")

    async def handle_start(self, cmd: Command) -> None:
        target = self.target_rung(cmd)
        if self.pending is not None and self.pending.what != "leave_failed":  # skip the wait, keep the rung
            finish(cmd, CommandResult("accepted", "relaunching now", self.lifecycle.state.value))
            await self.launch(target, after_incident=False)
            return
        finish(cmd, CommandResult("accepted", "starting", self.lifecycle.state.value))
        if (note := xids.unblock(self.xids)) is not None:
            self.record(note.event, **note.fields)
        if self.lifecycle.state == State.FAILED:
            await self.leave_failed("failed_left", "start requested", target)
        else:
            await self.launch(target, after_incident=False)

    async def handle_restart(self, cmd: Command) -> None:
        hint = f"manual restart to {cmd.rung or self.current_rung_name()}"
        st = self.lifecycle.state
        if st in (State.STOPPED, State.FAILED) or self.slot.child is None:
            finish(cmd, CommandResult("accepted", hint, st.value))
            target = self.target_rung(cmd)
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
        await self.manual_restart(idx, cmd.reason, diagnose=cmd.diagnose, incident_id=pending_id)

    async def handle_diagnose(self, cmd: Command) -> None:
        obs = self.slot.obs if self.slot.obs is not None else await self.observe()
        if not obs.tree.processes:
            finish(cmd, CommandResult("invalid", "no server process to diagnose", self.lifecycle.state.value))
            return
        trigger = "hung" if self.lifecycle.state == State.HUNG else "manual"
        incident_id = self.unique_incident_id("diagnose")
        result = await self.capture_bundle(incident_id, trigger, None, obs, None, native=cmd.native, gdb=cmd.gdb)
        st = self.lifecycle.state.value
        if result is None:
            finish(cmd, CommandResult("failed", "capture failed", st))
            return
        bundle = result.id if result.path is not None else None
        answer = CommandResult("done", result.error or "captured", st, bundle_id=bundle, summary=dict(result.summary))
        finish(cmd, answer)

    async def handle_reload(self, cmd: Command) -> None:
        """SIGHUP: re-read the config; an invalid one is refused and the old one stays in force."""
        if self.config_path is None:
            finish(cmd, CommandResult("invalid", "no config file to reload", self.lifecycle.state.value))
            return
        self.notifier.reloading()
        try:
            new = await asyncio.to_thread(load_settings, self.config_path)
            validation.refuse_restart_only_changes(self.settings, new)
            if self.on_reload is not None:
                await self.on_reload(new)
        except ConfigError as err:
            self.record("config_reload_refused", "error", error=str(err))
            finish(cmd, CommandResult("invalid", str(err), self.lifecycle.state.value))
        else:
            self.reload(new)
            finish(cmd, CommandResult("done", "reloaded", self.lifecycle.state.value))
        finally:
            self.notifier.ready()

    def target_rung(self, cmd: Command) -> int:
        """The rung asked for; else the one a pending launch waits to launch (the ladder's decision:
        a start during the backoff skips only the wait); else the current one."""
        idx = self.settings.rung_index(cmd.rung) if cmd.rung else None
        if idx is not None:
            return idx
        if self.pending is not None and self.pending.what != "leave_failed":
            return self.pending.rung
        return self.ladder.current

    # ---- the loop -------------------------------------------------------------------------

    async def run(self, *, autostart: bool = True) -> None:
        """Start (resuming the ladder), then poll until a shutdown command; always stop the tree."""
        try:
            try:
                await self.startup(autostart)
            except Exception as err:  # not even start-up may end the daemon
                await self.survive(err)
                if autostart and self.lifecycle.state == State.STOPPED and not self.stopped_by_request:
                    self.start_later(f"start-up failed ({err!r})")
            next_tick = self.clock.monotonic()
            while not self.shutdown_requested:
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
            if self.handoff and self.slot.child is not None and self.slot.record is not None:
                await self.hand_over()  # SIGUSR2: the server stays for the successor
            else:
                await self.shutdown()

    async def startup(self, autostart: bool) -> None:
        srv, api = self.settings.server, self.settings.api
        # who holds this state directory's lock, for a daemon that meets this one's tree on its port
        about = (self.state_dir, self.config_path, (srv.host, srv.port), (api.host, api.port))
        await asyncio.to_thread(instance_lock.write_about, *about)
        d = self.settings.diagnostics
        tools = await asyncio.to_thread(self_check, d.py_spy_path, d.gdb_path)
        gpm = await asyncio.to_thread(self.observer.gpm_check)
        self.selfcheck = (*tools, gpm, *self.observer.gpu_source_checks())
        for check in self.selfcheck:
            self.log.info("selfcheck", tool=check.name, ok=check.ok, detail=check.detail)
        names = tuple(r.name for r in self.settings.ladder)
        saved, why = load(self.state_dir / "state.json", names)
        if saved is not None:
            self.marker, self.ladder, self.slot.record = saved.marker, saved.ladder, saved.server
            self.stopped_by_request = saved.stopped
            self.inhand.decided = saved.decided
            self.inhand.last_incident = saved.last_incident  # `status` keeps the why across a daemon restart
        rung = names[self.ladder.current]
        self.log.info("state_loaded", detail=why, rung=rung, last_good=self.ladder.last_good)
        self.journal.append("daemon_started", version=self.version, state=why, rung=rung)
        if saved is not None and saved.open_incident is not None:
            self.record_interrupted(saved.open_incident)
        self.persist()
        if saved is None:
            not_adopted = f"no server record to adopt it by ({why})"
        elif saved.server is None:
            not_adopted = "state.json records no running server (its predecessor was stopping or launching it)"
        else:
            not_adopted = "its server record did not prove it ours (see adoption_refused)"
        if saved is None or saved.open_incident is None:
            if await self.adopt_server():
                self.publish()
                return
        else:  # the predecessor had judged this server and was stopping it: its verdict stands
            not_adopted = f"incident {saved.open_incident.id} ({saved.open_incident.cause}) was under way"
            self.refuse_adoption(not_adopted)
        await self.stop_leftovers(not_adopted)
        # The previous daemon's server, if any, was just stopped: its attempt ends here.
        self.ladder = record_end(self.ladder, "daemon_restarted", self.clock.wall())
        decided = self.inhand.decided
        if autostart and self.stopped_by_request:  # the operator's stop outlives the daemon
            self.reason = "stopped by request before the daemon restarted (start it: sglang-supervisor start)"
            self.record("stayed_stopped", reason=self.reason)
        elif autostart and decided is not None and (at := self.settings.rung_index(decided.rung)) is not None:
            # A predecessor decided a relaunch and was gone before making it (handoff or crash in
            # the backoff): that decision stands, the rung that just failed is not tried again.
            wait = min(max(0.0, decided.launch_at - self.clock.wall()), self.settings.restart.backoff_max_s)
            self.record("decision_resumed", rung=decided.rung, reason=decided.reason, backoff_s=round(wait, 3))
            self.move(State.RESTARTING, f"resuming the ladder's decision: {decided.reason}")
            self.wait_then(Pending("resume", at, self.clock.monotonic() + wait, after_incident=True))
        elif autostart:
            rung_index = resume_rung(self.ladder, len(self.settings.ladder), self.settings.restart.start_from)
            await self.launch(rung_index, after_incident=False)
        self.publish()

    def start_later(self, why: str) -> None:
        """Start-up failed before the first launch: try it from the tick after `backoff_initial_s`."""
        delay = self.settings.restart.backoff_initial_s
        rung = resume_rung(self.ladder, len(self.settings.ladder), self.settings.restart.start_from)
        self.move(State.RESTARTING, f"{why}; launching in {delay:g} s")
        self.wait_then(Pending("launch", rung, self.clock.monotonic() + delay))

    async def tick(self) -> None:
        """One poll. The pending timer and a restart cut short come first; each step is one call."""
        self.take_xids()
        if await self.resume_cut_short() or await self.fire_pending():
            return
        await self.reap_orphans()
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
        record = self.slot.record
        if record is None:
            return False
        rung = self.settings.rung_index(record.rung)
        files, lines = self.log_files(), self.settings.logs.memory_lines
        taken = await takeover.take_over(record, rung, self.marker, self.control, files, lines, self.clock)
        if isinstance(taken, takeover.NotAdopted):
            self.refuse_adoption(taken.why)
            return False
        assert rung is not None
        self.ladder = replace(self.ladder, current=rung)
        self.fresh_slot(record.launched_wall)
        self.slot.adopted = True
        self.slot.capture, self.slot.child, self.slot.record = taken.capture, taken.child, record
        self.bind_server()
        self.persist()
        self.record("server_adopted", pid=record.pid, rung=record.rung, starttime=record.starttime)
        self.move(State.STARTING, f"adopted server pid {record.pid} on rung {record.rung}")
        return True

    def refuse_adoption(self, why: str) -> None:
        """The saved server is not taken over; the caller stops whatever carries the marker."""
        record = self.slot.record
        self.slot.record = None
        if record is not None:
            self.record("adoption_refused", "warning", pid=record.pid, reason=why)

    async def hand_over(self) -> None:
        """Exit for a successor (an upgrade): the server keeps running, state.json says how to adopt it."""
        self.notifier.stopping()
        if self.slot.capture is not None:
            await asyncio.to_thread(self.slot.capture.close)  # its position now covers every line read
        self.persist()
        record = self.slot.record
        assert record is not None
        self.record("daemon_handoff", pid=record.pid, rung=record.rung, state=self.lifecycle.state.value)
        await self.observer.close()
        self.answer_queued("daemon handed over to its successor", self.lifecycle.state.value)

    # ---- the daemon's care of itself -------------------------------------------------------

    async def survive(self, err: Exception) -> None:
        """An exception escaped a poll or a command: log it, count it, and leave no half-done restart
        (one cut short is taken up again by the next tick, `resume_cut_short`)."""
        self.counters.loop_errors += 1
        self.log.error("loop_error", error=repr(err), state=self.lifecycle.state.value, exc_info=err)
        self.metrics.loop_error(type(err).__name__)
        self.journal.append("loop_error", error=repr(err)[:500], state=self.lifecycle.state.value)
        self.inhand.diagnosing = False
        self.publish()
        if self.lifecycle.state in RESTART_UNDER_WAY and not self.shutdown_requested:
            self.inhand.resume_after_error = True

    def record_interrupted(self, inc: OpenIncident) -> None:
        """The previous daemon died capturing evidence: the incident is recorded as it stood."""
        self.counters.incidents += 1
        self.metrics.incident(inc.cause, "none")
        view = IncidentView(
            id=inc.id, cause=inc.cause, at=iso(inc.at) or "", rung=inc.rung, detail="capture interrupted"
        )
        self.inhand.last_incident = view
        self.journal.append("incident", **view.model_dump(), interrupted=True)
        self.log.warning("incident_interrupted", id=inc.id, cause=inc.cause, rung=inc.rung)
        self.ladder = record_end(self.ladder, inc.cause, self.clock.wall())
