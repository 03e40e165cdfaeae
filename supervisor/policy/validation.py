"""Whether a command applies now: the one validation, a pure rule over the state.

`check` runs twice for each command: at submit (`queued=False`), so an operator hears "already
under way" at once instead of waiting behind a restart, and again when the owner's dispatcher takes
it from the queue (`queued=True`), where only what the state has since made meaningless is refused
(the command's own flag, `restart_pending` or `diagnosing`, is then set by its submit).
Adding a command kind: a `handle_<kind>` method on the owner, and its rule here if it has one.
"""

from __future__ import annotations

from supervisor.common.configerror import ConfigError
from supervisor.config.settings import Settings
from supervisor.policy.lifecycle import RESTART_UNDER_WAY, RUNNING, Pending, State
from supervisor.status.commands import Command, CommandResult


def check(
    cmd: Command,
    *,
    state: State,
    settings: Settings,
    restart_pending: bool,
    diagnosing: bool,
    queued: bool,
) -> CommandResult | None:
    """None when `cmd` applies now, else the answer that ends it."""
    st = state.value
    if cmd.kind == "restart":
        if cmd.rung is not None and settings.rung_index(cmd.rung) is None:
            names = ", ".join(r.name for r in settings.ladder)
            return CommandResult("invalid", f"unknown rung {cmd.rung!r}; rungs: {names}", st)
        if not queued and (restart_pending or state in RESTART_UNDER_WAY):
            return CommandResult("conflict", f"a restart is already under way (state {st})", st)
    if cmd.kind == "diagnose":
        if not queued and (diagnosing or state == State.DIAGNOSING):
            return CommandResult("busy", "a capture is already running", st)
        if state not in RUNNING and state != State.HUNG:
            return CommandResult("invalid", f"no server to diagnose (state {st})", st)
    if cmd.kind == "start" and state in RUNNING:
        # Idempotent, as `stop` on a stopped server is: what a start asks for holds already. A start
        # onto a named rung cannot be honoured by the server that runs (`restart --rung` does that).
        if cmd.rung is not None:
            return CommandResult("conflict", f"already running (state {st}); `restart --rung {cmd.rung}` moves it", st)
        return CommandResult("done", f"already running (state {st})", st)
    if cmd.kind == "stop" and state == State.STOPPED:
        return CommandResult("done", "already stopped", st)
    return None


def refuse_restart_only_changes(old: Settings, new: Settings) -> None:
    """What a reload cannot apply whole is refused, so nothing is half applied: the state directory
    (journal, state.json, logs and bundles are open there) and the server port (the running server
    listens on the old one, and its stop is verified there)."""
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


def target_rung(cmd: Command, settings: Settings, state: State, pending: Pending | None, current: int) -> int:
    """The rung a start or restart launches: the one asked for; else the one a pending launch waits
    to launch (the ladder's decision: a start during the backoff skips only the wait); out of
    `failed`, the preferred rung, where the cooldown starts too (issue 38: the two agree); else the
    current one."""
    idx = settings.rung_index(cmd.rung) if cmd.rung else None
    if idx is not None:
        return idx
    if state == State.FAILED:
        return 0
    if pending is not None and pending.what != "leave_failed":
        return pending.rung
    return current
