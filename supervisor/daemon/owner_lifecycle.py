"""The owner's acts on the server: launch, incident (evidence, stop, the ladder's decision), stop,
sweep leftovers, shut down. Each calls a helper with explicit values (`launching`, `slate`,
`stopping`, `evidence`, `xids`) and applies the outcome it returns to the records.

`ServerLifecycle` is the second part of the one owner, `supervisor.daemon.owner.Supervisor`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace

from probes.types import Observation
from supervisor.config.render import render_rung
from supervisor.daemon import launching, slate, stopping, xids
from supervisor.daemon.evidence import collect, provisional_class
from supervisor.daemon.owner_state import OwnerState
from supervisor.daemon.persist import Decided, OpenIncident, marker_for
from supervisor.daemon.publish import iso
from supervisor.daemon.records import Pending
from supervisor.diagnostics import BundleResult, Redactor
from supervisor.policy import gpufit
from supervisor.policy.ladder import (
    Decision,
    Incident,
    backoff,
    fresh_start,
    next_rung,
    record_end,
    record_incident,
    record_launch,
)
from supervisor.policy.lifecycle import RUNNING, State
from supervisor.policy.watchdog import Verdict
from supervisor.process.control import LogFiles
from supervisor.process.owners import STATE_DIR_ENV
from supervisor.status.causes import HUNG_CAUSES, Cause
from supervisor.status.commands import CommandResult, finish
from supervisor.status.eventnames import EventName
from supervisor.status.snapshot import IncidentView


class ServerLifecycle(OwnerState):
    # ---- launch -----------------------------------------------------------------------------

    async def launch(self, rung_index: int, *, after_incident: bool) -> None:
        rung = self.settings.ladder[rung_index]
        rendered = render_rung(self.settings.server, rung)
        if (blocked := self.xids.blocked_reason()) is not None and self.lifecycle.state != State.STOPPED:
            self.record("launch_refused", "error", rung=rung.name, reason=blocked)
            self.move(State.FAILED, blocked)
            return
        srv = self.settings.server
        holder = await launching.port_holder_of(srv.host, srv.port)
        if holder is not None and await self.stop_leftovers(
            f"port {srv.port} is held by a leftover (this state directory's, or a dead daemon's: its lock is free)"
        ):  # a live daemon's tree, or one whose daemon cannot be found, is kept (supervisor.process.owners)
            holder = await launching.port_holder_of(srv.host, srv.port)
        if holder is not None:
            self.counters.port_refusals += 1
            delay = backoff(self.counters.port_refusals, self.settings.restart, self.rand())
            why = f"port {srv.port} is held by {holder}: not launching rung {rung.name}; next try in {delay:.1f} s"
            self.defer_launch(rung_index, after_incident, delay, why, "port_busy", port=srv.port, holder=holder)
            return
        self.counters.port_refusals = 0
        self.pending = None
        env = self.child_env(rendered.env)
        env[STATE_DIR_ENV] = str(self.state_dir.resolve())  # whose the tree is (supervisor.process.owners)
        tree = set(self.slot.obs.tree.pids) if self.slot.obs is not None and self.slot.child is not None else set()
        clean = await slate.prepare(
            self.stop_tools(),
            shm_dir=self.settings.restart.shm_dir,
            state_dir=self.state_dir,
            tree=tree,
            env=self.child_env(render_rung(srv, self.settings.ladder[self.ladder.current]).env),
            marker=self.marker,
            argv=rendered.argv,
            slate=self.settings.slate,
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
        self.fresh_slot(launched_wall)
        request = launching.SpawnRequest(
            rendered.argv, env, self.marker, srv.cwd, self.log_files(), self.settings.logs.memory_lines,
            rung.name, launched_wall,
        )  # fmt: skip
        spawned = await launching.spawn(self.control, request, self.clock)
        if isinstance(spawned, launching.SpawnFailed):
            self.record("spawn_failed", "error", rung=rung.name, error=spawned.error)
            self.move(State.STARTING, f"launching rung {rung.name}")
            self.cannot_launch(spawned.error)
            return
        slot = self.slot
        slot.child, slot.capture, slot.record = spawned.child, spawned.capture, spawned.record
        self.bind_server()
        self.persist()  # from here on a successor daemon can adopt this server
        # argv and env may carry secrets (--api-key, tokens in URLs): logs and the journal get them redacted.
        shown = Redactor.from_envs([env]).argv(rendered.argv)
        self.record("server_launched", rung=rung.name, pid=spawned.child.pid, argv=list(shown))
        self.move(State.STARTING, f"launched rung {rung.name}")

    def gpu_refused(self, rung_index: int, after_incident: bool, refused: str, *, strict: bool) -> None:
        """Processes outside the server hold GPU memory ([slate] gpu_strangers, policy/gpufit.py):
        wait on the refused-launch backoff, told once (`launch_blocked`) when the backoff reaches
        its cap; or, strictly, `failed` now."""
        rung = self.settings.ladder[rung_index].name
        self.counters.gpu_refusals += 1
        if strict:
            why = f"{refused}: not launching rung {rung}"
            self.record("launch_refused", "error", rung=rung, reason=why, gpu=refused)
            self.metrics.launch_refused("gpu_held")
            if self.lifecycle.state not in (State.RESTARTING, State.FAILED):
                self.move(State.RESTARTING, why)
            self.fail(why, why)
            return
        rs = self.settings.restart
        delay = backoff(self.counters.gpu_refusals, rs, self.rand())
        why = f"{refused}: not launching rung {rung}; next try in {delay:.1f} s"
        self.defer_launch(rung_index, after_incident, delay, why, "gpu_held", gpu=refused)
        if self.counters.gpu_refusals == gpufit.refusals_to_cap(rs.backoff_initial_s, rs.backoff_max_s):
            self.record("launch_blocked", "error", rung=rung, reason=refused, refusals=self.counters.gpu_refusals)

    def defer_launch(
        self, rung_index: int, after_incident: bool, delay: float, reason: str, refusal: str, **fields: object
    ) -> None:
        """A launch refused now (`refusal`: the `launches_refused_total` reason): journalled, counted,
        and tried again after `delay` through the one pending timer the tick advances."""
        rung = self.settings.ladder[rung_index].name
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
        self.counters.incidents += 1
        self.metrics.incident("exited", "none")
        self.inhand.last_incident = IncidentView(
            id=self.unique_incident_id("exited"),
            cause="exited",
            at=iso(self.clock.wall()) or "",
            rung=self.current_rung_name(),
            detail=why[:500],
        )
        self.journal.append("incident", **self.inhand.last_incident.model_dump())
        self.ladder = record_end(self.ladder, "exited", self.clock.wall())
        self.persist()
        self.fail(f"configuration: {why} (fix it, then: sglang-supervisor start)", why)

    def fail(self, reason: str, cooldown_reason: str) -> None:
        """`failed`; with `failed_cooldown_s`, the pending timer starts again from the preferred rung."""
        self.move(State.FAILED, reason)
        cooldown = self.settings.restart.failed_cooldown_s
        if cooldown > 0:
            self.journal.append("failed_cooldown", retry_in_s=cooldown, reason=cooldown_reason)
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
        diagnose: bool = True,
        incident_id: str | None = None,
    ) -> None:
        incident_id = incident_id or self.unique_incident_id(cause)
        self.log = self.log.bind(incident=incident_id)  # its capture, stop and decision name it
        hang_class = provisional_class(verdict)
        bundle_id: str | None = None
        keeper = self.slot.keeper.describe() if self.slot.keeper is not None else ""
        if keeper and verdict is not None:  # the server blocked on its output: name who stopped reading it
            verdict = replace(verdict, reason=f"{verdict.reason}; {keeper}")
        detail, named = xids.explain(self.xids, self.clock.wall(), verdict.reason if verdict is not None else "")
        self.log.warning("incident", id=incident_id, cause=cause, reason=detail, rung=self.current_rung_name())
        alive = obs is not None and obs.tree.root_alive and bool(obs.tree.processes)
        if diagnose and alive and obs is not None and cause in HUNG_CAUSES | {"manual", "spec_regression"}:
            if cause in HUNG_CAUSES:
                self.move(State.HUNG, detail)
            self.move(State.DIAGNOSING, f"capturing evidence for {incident_id}")
            self.inhand.open_incident = OpenIncident(incident_id, cause, self.current_rung_name(), self.clock.wall())
            self.persist()
            try:
                trigger = "hung" if cause in HUNG_CAUSES else "manual"
                result = await self.capture_bundle(incident_id, trigger, cause, obs, verdict)
            finally:
                self.inhand.open_incident = None
            if result is not None:
                bundle_id = result.id if result.path is not None else None
                if result.hang_class not in ("unknown", "") or hang_class is None:
                    hang_class = result.hang_class if cause in HUNG_CAUSES else hang_class
        self.counters.incidents += 1
        self.metrics.incident(cause, hang_class or "none")
        self.inhand.last_incident = IncidentView(
            id=incident_id,
            cause=cause,
            hang_class=hang_class,
            at=iso(self.clock.wall()) or "",
            rung=self.current_rung_name(),
            detail=detail[:500],
            bundle=bundle_id,
        )
        extra = {"xids": xids.as_records(named)} if named else {}
        self.journal.append("incident", **self.inhand.last_incident.model_dump(), **extra)
        await self.recover(Incident(cause, hang_class), forced_rung=forced_rung, manual=cause == "manual")
        self.log = self.log.try_unbind("incident")  # a relaunch has already bound its own context

    async def manual_restart(self, rung: int | None, reason: str, *, diagnose: bool, incident_id: str) -> None:
        """A restart of the running server asked for (an operator, a promotion): a `manual` incident."""
        verdict = Verdict(status="incident", cause="manual", reason=reason or "restart requested")
        obs = self.slot.obs
        await self.incident("manual", verdict, obs, forced_rung=rung, diagnose=diagnose, incident_id=incident_id)

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
        self.inhand.diagnosing = True
        self.publish()
        rendered = render_rung(self.settings.server, self.settings.ladder[self.ladder.current])
        slot = self.slot
        try:
            gpu_all = await asyncio.to_thread(self.observer.gpu.snapshot_all)
            result = await self.beating(
                collect(
                    settings=self.settings,
                    incident_id=incident_id,
                    trigger=trigger,
                    cause=cause,
                    obs=obs,
                    verdict=verdict,
                    rendered=rendered,
                    env=self.child_env(rendered.env),  # what the server got; the bundle redacts it
                    log_tail=slot.capture.tail(self.settings.diagnostics.log_tail_lines) if slot.capture else [],
                    gpu_all=gpu_all,
                    cpu_rate=slot.history.cpu_rate if slot.history is not None else None,
                    native=native,
                    gdb=gdb,
                    hung=trigger == "hung",
                    created_at=self.clock.wall(),
                    gpu_xids=tuple(xids.as_records(list(self.xids.recent))),
                    group=self.group_doc(incident_id),
                )
            )
        except Exception as err:  # a capture must never take the daemon down
            self.log.exception("diagnostics_failed", id=incident_id)
            self.journal.append("diagnostics_failed", id=incident_id, error=repr(err))
            self.metrics.diagnostic(0.0, "error")
            return None
        finally:
            self.inhand.diagnosing = False
        written = result.path is not None
        if not written:
            self.counters.bundle_write_errors += 1
        self.metrics.diagnostic(result.duration_s, "written" if written else "write_failed")
        self.journal.append(
            "bundle_written" if result.path is not None else "bundle_write_failed",
            id=result.id,
            hang_class=result.hang_class if trigger == "hung" else None,  # a healthy server is not "deadlocked"
            duration_s=round(result.duration_s, 3),
            error=result.error,
        )
        # A bundle that could not be written (full disk) is a warning: the incident goes on without it.
        (self.log.info if written else self.log.warning)(
            "bundle", id=result.id, hang_class=result.hang_class, path=str(result.path), error=result.error
        )
        return result

    def group_doc(self, incident_id: str) -> Mapping[str, object] | None:
        return None  # a multi-node group's part of the bundle (owner_group.GroupSupervisor)

    async def recover(self, incident: Incident, *, forced_rung: int | None, manual: bool) -> None:
        """Stop the server, ask the ladder, then relaunch now (no backoff) or set the pending timer."""
        if self.lifecycle.state != State.RESTARTING:
            self.move(State.RESTARTING, f"stopping after {incident.cause}")
        ok = await self.stop_server(f"incident {incident.cause}")
        if (blocked := self.xids.blocked_reason()) is not None:  # a relaunch onto that GPU fails the same way
            self.move(State.FAILED, blocked)
            return
        if not ok and self.settings.restart.release_policy == "fail":
            self.move(State.FAILED, "the old server did not release its port or GPU memory (release_policy=fail)")
            return
        now_wall = self.clock.wall()
        if manual:
            self.ladder = record_end(self.ladder, "manual", now_wall)
            target = forced_rung if forced_rung is not None else self.ladder.current
            decision = Decision("relaunch", target, "manual restart", 0.0)
        else:
            self.ladder = record_incident(self.ladder, incident, now_wall)
            if forced_rung is not None:
                decision = Decision("relaunch", forced_rung, "rung chosen by request", 0.0)
            else:
                rs, rand, spec = self.settings.restart, self.rand(), self.speculative()
                decision = next_rung(
                    self.settings.ladder, self.ladder, incident, rs, now_wall=now_wall, rand=rand, speculative=spec
                )
        self.metrics.restart(incident.cause)  # manual restarts count too (cause "manual")
        if decision.action == "relaunch":  # saved before the backoff: a successor relaunches this rung
            name = self.settings.ladder[decision.rung].name
            self.inhand.decided = Decided(name, decision.reason, now_wall + decision.backoff_s)
        self.persist()
        self.record(
            "ladder_decision",
            action=decision.action,
            rung=decision.rung,
            reason=decision.reason,
            backoff_s=round(decision.backoff_s, 3),
        )
        if decision.action == "give_up":
            self.fail(decision.reason, decision.reason)
            return
        self.reason = decision.reason
        if decision.backoff_s <= 0:
            await self.launch(decision.rung, after_incident=not manual)
            return
        self.wait_then(Pending("launch", decision.rung, self.clock.monotonic() + decision.backoff_s, not manual))

    # ---- stop -------------------------------------------------------------------------------

    async def stop_server(self, why: str) -> bool:
        """Stop the tree, verify the port and GPU memory are free, empty the slot. True when verified."""
        slot = self.slot
        seen = slot.obs.tree.pids if slot.obs is not None else ()
        stopped = await stopping.stop_tree(self.stop_tools(), slot.child, self.marker, tuple(seen), why)
        if slot.capture is not None:
            await asyncio.to_thread(slot.capture.close)
            self.server_log_write_errors()  # its last count, before the next keeper starts its file afresh
        slot.capture, slot.child, slot.record, slot.history = None, None, None, None
        self.log = self.log.bind(pid=None)  # no server from here on
        self.last_stop = stopped.view
        self.record("server_stopped", "info" if stopped.ok else "error", **stopped.doc)
        return stopped.ok

    async def stop_leftovers(self, why: str) -> tuple[int, ...]:
        """What an earlier daemon left running and is not adopted: stopped (one sweep, in
        supervisor.process.leftovers), verified, and journalled with why."""
        markers = (self.marker, marker_for(self.state_dir))  # an older version saved another marker
        swept = await stopping.stop_leftovers(self.stop_tools(), markers, why)
        if swept.pids:
            self.record("leftovers_stopped", "warning" if swept.ok else "error", **swept.doc)
        return swept.pids

    async def shutdown(self) -> None:
        self.notifier.stopping()
        if self.slot.child is not None or self.lifecycle.state in RUNNING:
            try:
                if self.lifecycle.state != State.RESTARTING:
                    self.move(State.RESTARTING, "daemon shutting down")
                await self.stop_server("daemon shutdown")
            except Exception:
                self.log.exception("shutdown_stop_failed")
        if self.lifecycle.state != State.STOPPED:
            self.move(State.STOPPED, "daemon shut down")
        self.ladder = record_end(self.ladder, "daemon_shutdown", self.clock.wall())
        if not self.handoff:  # a service stop: the next service start starts the server again
            self.stopped_by_request = False
        self.persist()
        await self.observer.close()
        self.answer_queued("daemon shut down", State.STOPPED.value)

    def answer_queued(self, why: str, state: str) -> None:
        while not self.queue.empty():
            finish(self.queue.get_nowait(), CommandResult("failed", why, state))

    # ---- what the server gets ---------------------------------------------------------------

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


_NOT_FOR_CHILD = frozenset(
    {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "INVOCATION_ID"}
)
