"""Commands from the queue (API, signals): stop, start, restart, diagnose, reload.

Answers that need no work (a conflict, an unknown rung) are given at once by `answer_now`, so an
operator never waits behind a restart to hear "already under way".
"""

from __future__ import annotations

import asyncio

import structlog

from supervisor.config.settings import ConfigError, Settings, load_settings
from supervisor.daemon import grouping, upkeep
from supervisor.daemon.actions import capture_bundle, incident, launch
from supervisor.daemon.commands import Command, CommandResult, finish
from supervisor.daemon.core import Core
from supervisor.daemon.guards import unique_incident_id
from supervisor.daemon.stopping import stop_server
from supervisor.daemon.xids import unblock
from supervisor.policy.ladder import record_end
from supervisor.policy.lifecycle import RUNNING, State
from supervisor.policy.watchdog import Verdict

log = structlog.get_logger("supervisor")


def answer_now(sup: Core, c: Command) -> CommandResult | None:
    st = sup.lifecycle.state
    if c.kind == "restart":
        if c.rung is not None and sup.settings.rung_index(c.rung) is None:
            names = ", ".join(r.name for r in sup.settings.ladder)
            return CommandResult("invalid", f"unknown rung {c.rung!r}; rungs: {names}", st.value)
        if sup.restart_pending or st in (State.HUNG, State.DIAGNOSING, State.RESTARTING):
            return CommandResult("conflict", f"a restart is already under way (state {st.value})", st.value)
    if c.kind == "diagnose":
        if sup.diagnosing or st == State.DIAGNOSING:
            return CommandResult("busy", "a capture is already running", st.value)
        if st not in RUNNING and st != State.HUNG:
            return CommandResult("invalid", f"no server to diagnose (state {st.value})", st.value)
    if c.kind == "start" and st in RUNNING:
        return CommandResult("conflict", f"already running (state {st.value})", st.value)
    if c.kind == "stop" and st == State.STOPPED:
        return CommandResult("done", "already stopped", st.value)
    return None


async def handle(sup: Core, cmd: Command) -> None:
    try:
        await handle_command(sup, cmd)
    except Exception as err:  # a command must never kill the loop
        finish(cmd, CommandResult("failed", f"{cmd.kind} failed: {err!r}", sup.lifecycle.state.value))
        await upkeep.survive(sup, err)
    finally:
        if cmd.kind == "restart":
            sup.restart_pending = False
        if cmd.kind == "diagnose":
            sup.diagnosing = False
        sup.publish()


async def handle_command(sup: Core, cmd: Command) -> None:
    early = None if cmd.kind in ("shutdown", "handoff", "reload") else answer_now_queued(sup, cmd)
    if early is not None:
        finish(cmd, early)
        return
    sup.journal.append("command", kind=cmd.kind, rung=cmd.rung, reason=cmd.reason, source=cmd.source)
    if cmd.kind in ("shutdown", "handoff"):
        sup.shutdown_requested = True
        sup.handoff = cmd.kind == "handoff"
        finish(cmd, CommandResult("accepted", "shutting down", sup.lifecycle.state.value))
    elif cmd.kind == "stop":
        finish(cmd, CommandResult("accepted", "stopping", sup.lifecycle.state.value))
        if sup.lifecycle.state != State.STOPPED:
            sup.move(State.RESTARTING, cmd.reason or "stop requested")
            await grouping.stop_together(sup, stop_server(sup, "stop requested"))  # the leader stops its group
            sup.ladder = record_end(sup.ladder, "stopped", sup.clock.wall())
            sup.stopped_by_request = True
            sup.persist()
            sup.move(State.STOPPED, cmd.reason or "stopped by request")
    elif cmd.kind == "start":
        idx = sup.settings.rung_index(cmd.rung) if cmd.rung else None
        finish(cmd, CommandResult("accepted", "starting", sup.lifecycle.state.value))
        target = idx if idx is not None else sup.ladder.current
        unblock(sup)
        if sup.lifecycle.state == State.FAILED:
            await upkeep.leave_failed(sup, "failed_left", "start requested", target)
        else:
            await launch(sup, target, after_incident=False)
    elif cmd.kind == "restart":
        await manual_restart(sup, cmd)
    elif cmd.kind == "diagnose":
        await manual_diagnose(sup, cmd)
    elif cmd.kind == "reload":
        await reload_config(sup, cmd)


async def reload_config(sup: Core, cmd: Command) -> None:
    """SIGHUP: re-read the config; an invalid one is refused and the old one stays in force."""
    if sup.config_path is None:
        finish(cmd, CommandResult("invalid", "no config file to reload", sup.lifecycle.state.value))
        return
    sup.notifier.reloading()
    try:
        new = await asyncio.to_thread(load_settings, sup.config_path)
        refuse_restart_only_changes(sup, new)
        if sup.on_reload is not None:
            await sup.on_reload(new)
    except ConfigError as err:
        log.error("config_reload_refused", error=str(err))
        sup.journal.append("config_reload_refused", error=str(err))
        finish(cmd, CommandResult("invalid", str(err), sup.lifecycle.state.value))
    else:
        sup.reload(new)
        finish(cmd, CommandResult("done", "reloaded", sup.lifecycle.state.value))
    finally:
        sup.notifier.ready()


def refuse_restart_only_changes(sup: Core, new: Settings) -> None:
    """What a reload cannot apply whole is refused, so nothing is half applied: the state directory
    (journal, state.json, logs and bundles are open there) and the server port (the running server
    listens on the old one, and its stop is verified there)."""
    old = sup.settings
    if new.state_dir.resolve() != old.state_dir.resolve():
        raise ConfigError(
            f"[paths] state_dir changed from {old.state_dir} to {new.state_dir}: a reload cannot move the "
            "journal, state and bundles; restart the daemon (systemctl restart) to apply it"
        )
    if (new.server.host, new.server.port) != (old.server.host, old.server.port):
        raise ConfigError(
            f"[server] host/port changed from {old.server.host}:{old.server.port} to "
            f"{new.server.host}:{new.server.port}: a reload cannot move a running server; restart the "
            "daemon (systemctl restart) to apply it"
        )


def answer_now_queued(sup: Core, cmd: Command) -> CommandResult | None:
    if cmd.kind == "restart":
        return None
    if cmd.kind == "diagnose":
        st = sup.lifecycle.state
        if st not in RUNNING and st != State.HUNG:
            return CommandResult("invalid", f"no server to diagnose (state {st.value})", st.value)
        return None
    if cmd.kind == "start" and sup.lifecycle.state in RUNNING:
        return CommandResult("conflict", "already running", sup.lifecycle.state.value)
    return None


async def manual_restart(sup: Core, cmd: Command) -> None:
    idx = sup.settings.rung_index(cmd.rung) if cmd.rung else None
    incident_id_hint = f"manual restart to {cmd.rung or sup.current_rung_name()}"
    st = sup.lifecycle.state
    if st in (State.STOPPED, State.FAILED) or sup.server is None:
        finish(cmd, CommandResult("accepted", incident_id_hint, st.value))
        target = idx if idx is not None else sup.ladder.current
        if st == State.FAILED:
            sup.move(State.RESTARTING, cmd.reason or "restart requested")
            await upkeep.leave_failed(sup, "failed_left", cmd.reason or "restart requested", target)
        else:
            await launch(sup, target, after_incident=False)
        return
    obs = sup.obs
    verdict = Verdict(status="incident", cause="manual", reason=cmd.reason or "restart requested")
    # Answer at once with the incident's id; the restart itself takes minutes.
    pending_id = unique_incident_id(sup, "manual")
    finish(cmd, CommandResult("accepted", incident_id_hint, st.value, incident_id=pending_id))
    await incident(sup, "manual", verdict, obs, forced_rung=idx, diagnose=cmd.diagnose, incident_id=pending_id)


async def manual_diagnose(sup: Core, cmd: Command) -> None:
    obs = sup.obs if sup.obs is not None else await sup.observe()
    if not obs.tree.processes and cmd.source != "group":  # a group bundle still keeps this node's log and GPUs
        finish(cmd, CommandResult("invalid", "no server process to diagnose", sup.lifecycle.state.value))
        return
    hung = sup.lifecycle.state == State.HUNG or cmd.source == "group"  # the group is hung, if not this node
    incident_id = cmd.incident_id or unique_incident_id(sup, "diagnose")
    grouping.note_capture(sup, incident_id)
    cause = sup.group.held_cause if sup.group is not None and cmd.source == "group" else None
    result = await capture_bundle(
        sup,
        incident_id,
        "hung" if hung else "manual",
        cause,
        obs,
        None,
        native=cmd.native,
        gdb=cmd.gdb,
        group=grouping.bundle_doc(sup, incident_id) if cmd.incident_id else None,
    )
    if result is None:
        finish(cmd, CommandResult("failed", "capture failed", sup.lifecycle.state.value))
        return
    finish(
        cmd,
        CommandResult(
            "done",
            result.error or "captured",
            sup.lifecycle.state.value,
            bundle_id=result.id if result.path is not None else None,
            summary=dict(result.summary),
        ),
    )
