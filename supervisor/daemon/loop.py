"""The supervisor task: observe, decide, act, record, once per poll.

Commands (API, signals) arrive on one queue and only this task touches processes. Blocking work
(probes, stopping the tree, dumps) runs in threads or subprocesses so the API stays responsive.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import structlog

from probes.types import Observation
from supervisor.daemon import actions, grouping, handlers, handover, upkeep, xids
from supervisor.daemon.commands import Command, CommandResult
from supervisor.daemon.core import Core
from supervisor.daemon.persist import load
from supervisor.diagnostics import self_check
from supervisor.policy.ladder import record_end, record_ready, record_stable, resume_rung
from supervisor.policy.lifecycle import RUNNING, SERVING, State
from supervisor.policy.watchdog import Mode, Verdict, assess, new_history

log = structlog.get_logger("supervisor")


class Supervisor(Core):
    """Owns the server tree, its lifecycle state and the ladder; the API sees `snapshot`/`submit`.

    The state and its primitives are `Core`'s; this class is the loop: observe, decide, act,
    record, with commands from the queue in between.
    """

    async def handle(self, cmd: Command) -> None:
        await handlers.handle(self, cmd)

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

    async def run(self, *, autostart: bool = True) -> None:
        """Start (resuming the ladder), then poll until a shutdown command; always stop the tree."""
        try:
            grouping.start(self)
            try:
                await self.startup(autostart)
            except Exception as err:  # not even start-up may end the daemon
                await upkeep.survive(self, err)
                if autostart and self.lifecycle.state == State.STOPPED and not self.stopped_by_request:
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
            if self.handoff and self.server is not None and self.server_record is not None:
                await handover.hand_over(self)  # SIGUSR2: the server stays for the successor
            else:
                await actions.shutdown(self)
            await grouping.close(self)

    async def startup(self, autostart: bool) -> None:
        self.selfcheck = await asyncio.to_thread(
            self_check, self.settings.diagnostics.py_spy_path, self.settings.diagnostics.gdb_path
        ) + (await asyncio.to_thread(self.observer.gpm_check),)
        for check in self.selfcheck:
            log.info("selfcheck", tool=check.name, ok=check.ok, detail=check.detail)
        names = tuple(r.name for r in self.settings.ladder)
        saved, why = load(self.state_dir / "state.json", names)
        if saved is not None:
            self.marker, self.ladder, self.server_record = saved.marker, saved.ladder, saved.server
            self.stopped_by_request = saved.stopped
            self.decided = saved.decided
            self.last_incident = saved.last_incident  # `status` keeps the why across a daemon restart
        log.info("state_loaded", detail=why, rung=names[self.ladder.current], last_good=self.ladder.last_good)
        self.journal.append("daemon_started", version=self.version, state=why, rung=names[self.ladder.current])
        if saved is not None and saved.open_incident is not None:
            upkeep.record_interrupted(self, saved.open_incident)
        self.persist()
        if saved is None:
            not_adopted = f"no server record to adopt it by ({why})"
        elif saved.server is None:
            not_adopted = "state.json records no running server (its predecessor was stopping or launching it)"
        else:
            not_adopted = "its server record did not prove it ours (see adoption_refused)"
        if saved is None or saved.open_incident is None:
            if await handover.adopt_server(self):
                self.publish()
                return
        else:  # the predecessor had judged this server and was stopping it: its verdict stands
            not_adopted = f"incident {saved.open_incident.id} ({saved.open_incident.cause}) was under way"
            handover.refuse_adoption(self, not_adopted)
        await actions.kill_leftovers(self, not_adopted)
        # The previous daemon's server, if any, was just stopped: its attempt ends here.
        self.ladder = record_end(self.ladder, "daemon_restarted", self.clock.wall())
        if autostart and self.stopped_by_request:  # the operator's stop outlives the daemon
            self.reason = "stopped by request before the daemon restarted (start it: sglang-supervisor start)"
            self.journal.append("stayed_stopped", reason=self.reason)
            log.info("stayed_stopped")
        elif autostart and self.decided is not None and self.settings.rung_index(self.decided.rung) is not None:
            await self.resume_decision()
        elif autostart:
            rung = resume_rung(self.ladder, len(self.settings.ladder), self.settings.restart.start_from)
            await actions.launch(self, rung, after_incident=False)
        self.publish()

    async def resume_decision(self) -> None:
        """A predecessor decided a relaunch and was gone before making it (handoff or crash in the
        backoff): that decision stands, the rung that just failed is not tried again."""
        decided = self.decided
        assert decided is not None
        rung = self.settings.rung_index(decided.rung)
        assert rung is not None
        wait = min(max(0.0, decided.launch_at - self.clock.wall()), self.settings.restart.backoff_max_s)
        self.journal.append("decision_resumed", rung=decided.rung, reason=decided.reason, backoff_s=round(wait, 3))
        log.info("decision_resumed", rung=decided.rung, reason=decided.reason, backoff_s=round(wait, 3))
        self.move(State.RESTARTING, f"resuming the ladder's decision: {decided.reason}")
        if await actions.wait_backoff(self, wait):
            await actions.launch(self, rung, after_incident=True)

    async def tick(self) -> None:
        xids.take(self)
        st = self.lifecycle.state
        if await upkeep.chores(self):
            return
        if st not in RUNNING:
            # Keep reading NVML (and looking for escaped processes by marker) while nothing runs,
            # so GPU gauges never freeze at the last server's values; no tree holds 0.
            await self.observe()
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
        judged = grouping.judge(self, verdict)  # a group's verdict; None: a worker holds it for the leader
        if judged is not None:
            await self.act(judged, obs)
        self.save_log_position()
        self.publish()

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
                self.stable_marked = False
                self.ladder = record_ready(self.ladder)
                if self.adopted:  # a takeover is not a load: the launch-to-ready time is the record's
                    self.takeover_s = round(now - self.launched_at, 3)
                    record = self.server_record
                    self.time_to_ready_s = record.time_to_ready_s if record is not None else None
                    self.persist()
                    self.metrics.takeover(self.takeover_s)
                    self.journal.append(
                        "server_ready", rung=self.current_rung_name(), adopted=True, takeover_s=self.takeover_s
                    )
                    self.move(State.READY, f"adopted server ready on rung {self.current_rung_name()}")
                    return
                self.time_to_ready_s = round(now - self.launched_at, 3)
                if self.server_record is not None:
                    self.server_record = replace(self.server_record, time_to_ready_s=self.time_to_ready_s)
                self.persist()
                self.metrics.ready(self.time_to_ready_s)
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
