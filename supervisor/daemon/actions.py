"""What the supervisor does about a verdict or a command: launch, capture, stop, verify, relaunch.

Free functions over the supervisor's `Core` (its state and primitives), kept apart so each file reads
as one concern: daemon.py is the loop and its decisions, this is the acting. They never import the
owner (`supervisor.daemon.loop`): imports flow daemon -> handlers -> actions -> stopping -> core. Only
`supervisor.process` sends signals or spawns.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Mapping
from dataclasses import replace

import structlog

from probes.types import Observation
from supervisor.config.render import render_rung
from supervisor.daemon import grouping, slate
from supervisor.daemon.adopt import ServerRecord, starttime_of
from supervisor.daemon.commands import CommandResult, finish
from supervisor.daemon.core import Core
from supervisor.daemon.evidence import collect, provisional_class
from supervisor.daemon.guards import port_available, unique_incident_id
from supervisor.daemon.persist import Decided, OpenIncident, marker_for
from supervisor.daemon.publish import iso
from supervisor.daemon.snapshot import IncidentView
from supervisor.daemon.stopping import gpu_verdict, stop_server, verify_release
from supervisor.daemon.xids import as_records, explain
from supervisor.diagnostics import BundleResult, Redactor
from supervisor.logs.capture import LogCapture
from supervisor.policy.ladder import Decision, Incident, next_rung, record_end, record_incident, record_launch
from supervisor.policy.lifecycle import RUNNING, State
from supervisor.policy.watchdog import Verdict
from supervisor.process.control import SpawnError

log = structlog.get_logger("supervisor")

HUNG_CAUSES = frozenset({"startup_stall", "startup_timeout", "serving_stall", "unhealthy", "rank_died"})


async def kill_leftovers(sup: Core, why: str = "") -> tuple[int, ...]:
    """Stop what an earlier daemon left running, verified like any stop (port free, GPU released).

    `why` says why it is not adopted: a server that was serving is reloaded by this, and the
    journal must say why (`leftovers_stopped.reason`)."""
    srv = sup.settings.server
    report = await sup.beating(asyncio.to_thread(sup.control.kill_marked, sup.marker, srv.host, srv.port))
    derived = marker_for(sup.state_dir)
    if derived != sup.marker:  # the saved marker was an older version's: sweep this directory's too
        more = await sup.beating(asyncio.to_thread(sup.control.kill_marked, derived, srv.host, srv.port))
        report = replace(
            report,
            pids_found=tuple(sorted({*report.pids_found, *more.pids_found})),
            killed=tuple(sorted({*report.killed, *more.killed})),
            survivors=tuple(sorted({*report.survivors, *more.survivors})),
            port_free=more.port_free,
            port_holders=more.port_holders,
        )
    if not report.pids_found:
        return ()
    released, held, waited = await verify_release(sup, report.pids_found)
    doc = {
        "reason": why or "a tree with this state directory's marker was running and is not adopted",
        "pids_found": list(report.pids_found),
        "killed": list(report.killed),
        "survivors": list(report.survivors),
        "port_free": report.port_free,
        "port_holders": list(report.port_holders),
        "stop_s": round(report.duration_s, 3),
        "gpu_released": gpu_verdict(released),
        "gpu_held_bytes": held,
        "release_wait_s": round(waited, 3),
    }
    sup.journal.append("leftovers_stopped", **doc)
    (log.warning if report.ok and released != "held" else log.error)("leftovers_stopped", **doc)
    return report.pids_found


# ---- launch -----------------------------------------------------------------------------


async def launch(sup: Core, rung_index: int, *, after_incident: bool) -> None:
    rung = sup.settings.ladder[rung_index]
    rendered = render_rung(sup.settings.server, rung)
    if (blocked := sup.xids.blocked_reason()) is not None and sup.lifecycle.state != State.STOPPED:
        sup.journal.append("launch_refused", rung=rung.name, reason=blocked)
        sup.move(State.FAILED, blocked)
        return
    if not await port_available(sup, rung_index, after_incident=after_incident):
        return
    if not await slate.prepare(sup, rung_index, after_incident=after_incident):
        return
    await grouping.launch_members(sup, rung.name)  # the members stopped with this node launch with it
    sup.ladder = record_launch(sup.ladder, rung_index, rung.name, sup.clock.wall(), after_incident=after_incident)
    sup.stopped_by_request = False
    sup.decided = None  # carried out
    sup.marker = marker_for(sup.state_dir)  # any earlier tree is stopped: new trees carry the derived marker
    if after_incident:
        sup.restarts += 1
    sup.persist()
    launched_wall = sup.clock.wall()
    sup.fresh_server_view(launched_wall)
    files = sup.log_files()
    # This launch's lines begin at the log's current end; the keeper appends after it.
    sup.capture = LogCapture(
        files.dir,
        memory_lines=sup.settings.logs.memory_lines,
        start=LogCapture.end_of(files.dir, files.name),
        monotonic=sup.clock.monotonic,
    )
    sup.log_seq = 0
    try:
        env = sup.child_env(rendered.env)
        sup.server = await asyncio.to_thread(
            sup.control.spawn, rendered.argv, env, sup.marker, sup.settings.server.cwd, files
        )
    except SpawnError as err:
        sup.server = None
        sup.server_record = None
        sup.capture = None
        log.error("spawn_failed", rung=rung.name, error=str(err))
        sup.journal.append("spawn_failed", rung=rung.name, error=str(err))
        sup.move(State.STARTING, f"launching rung {rung.name}")
        cannot_launch(sup, str(err))
        return
    sup.capture.start()
    starttime = starttime_of(sup.server.pid)
    sup.server_record = (
        None
        if starttime is None
        else ServerRecord(sup.server.pid, starttime, rung.name, launched_wall, sup.capture.position)
    )
    sup.persist()  # from here on a successor daemon can adopt this server
    # argv and env may carry secrets (--api-key, tokens in URLs): logs and the journal get them redacted.
    shown = Redactor.from_envs([env]).argv(rendered.argv)
    log.info("server_launched", rung=rung.name, pid=sup.server.pid, argv=shlex.join(shown))
    sup.journal.append("server_launched", rung=rung.name, pid=sup.server.pid, argv=list(shown))
    sup.move(State.STARTING, f"launched rung {rung.name}")


def cannot_launch(sup: Core, why: str) -> None:
    """The command cannot be executed at all (missing program or interpreter, permission denied):
    a configuration failure. Every rung runs the same program, so walking the ladder would only
    fail the same way; `failed` at once, with the reason, and the cooldown (if any) still applies."""
    sup.incidents += 1
    sup.metrics.incident("exited", "none")
    sup.last_incident = IncidentView(
        id=unique_incident_id(sup, "exited"),
        cause="exited",
        at=iso(sup.clock.wall()) or "",
        rung=sup.current_rung_name(),
        detail=why[:500],
    )
    sup.journal.append("incident", **sup.last_incident.model_dump())
    sup.ladder = record_end(sup.ladder, "exited", sup.clock.wall())
    sup.persist()
    sup.move(State.FAILED, f"configuration: {why} (fix it, then: sglang-supervisor start)")
    cooldown = sup.settings.restart.failed_cooldown_s
    if cooldown > 0:
        sup.failed_retry_at = sup.clock.monotonic() + cooldown
        sup.journal.append("failed_cooldown", retry_in_s=cooldown, reason=why)
        sup.publish()


# ---- incidents ----------------------------------------------------------------------------


async def incident(
    sup: Core,
    cause: str,
    verdict: Verdict | None,
    obs: Observation | None,
    *,
    forced_rung: int | None = None,
    diagnose: bool = True,
    incident_id: str | None = None,
) -> None:
    incident_id = incident_id or unique_incident_id(sup, cause)
    hang_class = provisional_class(verdict)
    bundle_id: str | None = None
    keeper = sup.keeper.describe() if sup.keeper is not None else ""
    if keeper and verdict is not None:  # the server blocked on its output: name who stopped reading it
        verdict = replace(verdict, reason=f"{verdict.reason}; {keeper}")
    detail, named = explain(sup, verdict.reason if verdict is not None else "")
    log.warning("incident", id=incident_id, cause=cause, reason=detail, rung=sup.current_rung_name())
    alive = obs is not None and obs.tree.root_alive and bool(obs.tree.processes)
    if diagnose and alive and obs is not None and cause in HUNG_CAUSES | {"manual", "spec_regression"}:
        if cause in HUNG_CAUSES:
            sup.move(State.HUNG, detail)
        sup.move(State.DIAGNOSING, f"capturing evidence for {incident_id}")
        sup.open_incident = OpenIncident(incident_id, cause, sup.current_rung_name(), sup.clock.wall())
        sup.persist()
        try:
            result = await grouping.capture_together(  # every node of a group, same id, same moment
                sup,
                incident_id,
                capture_bundle(sup, incident_id, "hung" if cause in HUNG_CAUSES else "manual", cause, obs, verdict),
            )
        finally:
            sup.open_incident = None
        if result is not None:
            bundle_id = result.id if result.path is not None else None
            if result.hang_class not in ("unknown", "") or hang_class is None:
                hang_class = result.hang_class if cause in HUNG_CAUSES else hang_class
    elif diagnose and sup.group is not None and cause != "manual":  # this node has nothing to dump; the others may
        await grouping.capture_together(sup, incident_id, asyncio.sleep(0))
    sup.incidents += 1
    sup.metrics.incident(cause, hang_class or "none")
    sup.last_incident = IncidentView(
        id=incident_id,
        cause=cause,
        hang_class=hang_class,
        at=iso(sup.clock.wall()) or "",
        rung=sup.current_rung_name(),
        detail=detail[:500],
        bundle=bundle_id,
    )
    sup.journal.append("incident", **sup.last_incident.model_dump(), **({"xids": as_records(named)} if named else {}))
    if grouping.exit_for_lws(sup):  # restart = "lws": the evidence is written, LWS recreates the group
        sup.persist()
        return
    await recover(sup, Incident(cause, hang_class), forced_rung=forced_rung, manual=cause == "manual")


async def capture_bundle(
    sup: Core,
    incident_id: str,
    trigger: str,
    cause: str | None,
    obs: Observation,
    verdict: Verdict | None,
    *,
    native: bool | None = None,
    gdb: bool | None = None,
    group: Mapping[str, object] | None = None,
) -> BundleResult | None:
    sup.diagnosing = True
    sup.publish()
    rendered = render_rung(sup.settings.server, sup.settings.ladder[sup.ladder.current])
    try:
        gpu_all = await asyncio.to_thread(sup.observer.gpu.snapshot_all)
        result = await sup.beating(
            collect(
                settings=sup.settings,
                incident_id=incident_id,
                trigger=trigger,
                cause=cause,
                obs=obs,
                verdict=verdict,
                rendered=rendered,
                env=sup.child_env(rendered.env),  # what the server got; the bundle redacts it
                log_tail=sup.capture.tail(sup.settings.diagnostics.log_tail_lines) if sup.capture else [],
                gpu_all=gpu_all,
                cpu_rate=sup.history.cpu_rate if sup.history is not None else None,
                native=native,
                gdb=gdb,
                hung=trigger == "hung",
                created_at=sup.clock.wall(),
                gpu_xids=tuple(as_records(list(sup.xids.recent))),
                group=group if group is not None else grouping.bundle_doc(sup, incident_id),
            )
        )
    except Exception as err:  # a capture must never take the daemon down
        log.exception("diagnostics_failed", id=incident_id)
        sup.journal.append("diagnostics_failed", id=incident_id, error=repr(err))
        sup.metrics.diagnostic(0.0, "error")
        return None
    finally:
        sup.diagnosing = False
    outcome = "written" if result.path is not None else "write_failed"
    if result.path is None:
        sup.bundle_write_errors += 1
    sup.metrics.diagnostic(result.duration_s, outcome)
    sup.journal.append(
        "bundle_written" if result.path is not None else "bundle_write_failed",
        id=result.id,
        hang_class=result.hang_class if trigger == "hung" else None,  # a healthy server is not "deadlocked"
        duration_s=round(result.duration_s, 3),
        error=result.error,
    )
    # A bundle that could not be written (full disk) is a warning: the incident goes on without it.
    (log.info if result.path is not None else log.warning)(
        "bundle", id=result.id, hang_class=result.hang_class, path=str(result.path), error=result.error
    )
    return result


# ---- recovery -----------------------------------------------------------------------------


async def recover(sup: Core, incident: Incident, *, forced_rung: int | None, manual: bool) -> None:
    if sup.lifecycle.state != State.RESTARTING:
        sup.move(State.RESTARTING, f"stopping after {incident.cause}")
    ok = await grouping.stop_together(sup, stop_server(sup, f"incident {incident.cause}"))
    if (blocked := sup.xids.blocked_reason()) is not None:  # a relaunch onto that GPU fails the same way
        sup.move(State.FAILED, blocked)
        return
    if not ok and sup.settings.restart.release_policy == "fail":
        sup.move(State.FAILED, "the old server did not release its port or GPU memory (release_policy=fail)")
        return
    if manual:
        sup.ladder = record_end(sup.ladder, "manual", sup.clock.wall())
        target = forced_rung if forced_rung is not None else sup.ladder.current
        decision = Decision("relaunch", target, "manual restart", 0.0)
    else:
        sup.ladder = record_incident(sup.ladder, incident, sup.clock.wall())
        if forced_rung is not None:
            decision = Decision("relaunch", forced_rung, "rung chosen by request", 0.0)
        else:
            decision = next_rung(
                sup.settings.ladder,
                sup.ladder,
                incident,
                sup.settings.restart,
                now_wall=sup.clock.wall(),
                rand=sup.random(),
                speculative=sup.speculative(),
            )
    sup.metrics.restart(incident.cause)  # manual restarts count too (cause "manual")
    if decision.action == "relaunch":  # saved before the backoff: a successor relaunches this rung
        name = sup.settings.ladder[decision.rung].name
        sup.decided = Decided(name, decision.reason, sup.clock.wall() + decision.backoff_s)
    sup.persist()
    sup.journal.append(
        "ladder_decision",
        action=decision.action,
        rung=decision.rung,
        reason=decision.reason,
        backoff_s=round(decision.backoff_s, 3),
    )
    log.info(
        "ladder_decision",
        action=decision.action,
        rung=decision.rung,
        reason=decision.reason,
        backoff_s=round(decision.backoff_s, 3),
    )
    if decision.action == "give_up":
        sup.move(State.FAILED, decision.reason)
        cooldown = sup.settings.restart.failed_cooldown_s
        if cooldown > 0:
            sup.failed_retry_at = sup.clock.monotonic() + cooldown
            sup.journal.append("failed_cooldown", retry_in_s=cooldown, reason=decision.reason)
            sup.publish()
        return
    sup.reason = decision.reason
    if await wait_backoff(sup, decision.backoff_s):
        await launch(sup, decision.rung, after_incident=not manual)


def decided_rung(sup: Core) -> int:
    """The rung the ladder decided on (a start during the backoff skips only the wait), else the current one."""
    idx = sup.settings.rung_index(sup.decided.rung) if sup.decided is not None else None
    return idx if idx is not None else sup.ladder.current


async def wait_backoff(sup: Core, seconds: float) -> bool:
    """Sleep out the backoff while still answering commands; False if told not to relaunch."""
    until = sup.clock.monotonic() + seconds
    sup.next_attempt_at = until
    try:
        while True:
            left = until - sup.clock.monotonic()
            sup.publish()
            if left <= 0:
                return True
            cmd = await sup.next_command(min(left, 1.0))
            if cmd is None:
                continue
            if cmd.kind in ("shutdown", "handoff"):  # no server during a backoff: nothing to hand over
                sup.shutdown_requested = True
                sup.handoff = cmd.kind == "handoff"  # still exit 75, so systemd starts the successor
                finish(cmd, CommandResult("accepted", "shutting down", sup.lifecycle.state.value))
                return False
            if cmd.kind == "stop":
                sup.stopped_by_request = True
                sup.persist()
                sup.move(State.STOPPED, cmd.reason or "stopped by request during backoff")
                finish(cmd, CommandResult("done", "stopped", State.STOPPED.value))
                return False
            if cmd.kind in ("start", "restart"):
                idx = sup.settings.rung_index(cmd.rung) if cmd.rung else None
                sup.restart_pending = False
                finish(cmd, CommandResult("accepted", "relaunching now", sup.lifecycle.state.value))
                await launch(sup, idx if idx is not None else decided_rung(sup), after_incident=False)
                return False
            await sup.handle(cmd)
    finally:
        sup.next_attempt_at = None


async def shutdown(sup: Core) -> None:
    sup.notifier.stopping()
    if sup.server is not None or sup.lifecycle.state in RUNNING:
        try:
            if sup.lifecycle.state != State.RESTARTING:
                sup.move(State.RESTARTING, "daemon shutting down")
            await stop_server(sup, "daemon shutdown")
        except Exception:
            log.exception("shutdown_stop_failed")
    if sup.lifecycle.state != State.STOPPED:
        sup.move(State.STOPPED, "daemon shut down")
    sup.ladder = record_end(sup.ladder, "daemon_shutdown", sup.clock.wall())
    if not sup.handoff:  # a service stop: the next service start starts the server again
        sup.stopped_by_request = False
    sup.persist()
    await sup.observer.close()
    while not sup.queue.empty():
        cmd = sup.queue.get_nowait()
        finish(cmd, CommandResult("failed", "daemon shut down", State.STOPPED.value))
