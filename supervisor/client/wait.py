"""What a script can rely on: `status` exit codes by state, and `--wait` on stop, start and restart.

In the spirit of `systemctl is-active`: `status` exits 0 only when the server is ready, and a
code per state otherwise, so `until sglang-supervisor status; do sleep 5; done` waits for a
server that serves. The codes 1-4 keep their meaning for every verb (the daemon refused, usage,
unreachable, token refused). docs/OPERATIONS.md lists them.

`settled` is the pure rule `--wait` polls `GET /status` with: a stop is done once the state is
`stopped` (and says whether the daemon verified the port and the GPUs free); a start or restart
once a new server (a new `started_at`) is serving, or the supervisor ended in `failed`/`stopped`
after the command took effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from supervisor.common.exitcodes import (
    EXIT_DEGRADED,
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_FALLBACK,
    EXIT_OK,
    EXIT_RECOVERING,
    EXIT_STARTING,
    EXIT_STOPPED,
)

STATE_EXIT: Mapping[str, int] = {
    "ready": EXIT_OK,
    "degraded": EXIT_DEGRADED,
    "starting": EXIT_STARTING,
    "hung": EXIT_RECOVERING,
    "diagnosing": EXIT_RECOVERING,
    "restarting": EXIT_RECOVERING,
    "stopped": EXIT_STOPPED,
    "failed": EXIT_FAILED,
}
SERVING = ("ready", "degraded")
# a 600 GB load takes minutes; a failed promote is two of them (the preferred rung, then back)
DEFAULT_WAIT_S = {"stop": 300.0, "start": 1800.0, "restart": 1800.0, "promote": 3600.0}

Verb = Literal["stop", "start", "restart", "promote"]


def state_exit(state: object) -> int:
    return STATE_EXIT.get(str(state), EXIT_ERROR)


def status_exit(status: Mapping[str, Any]) -> int:
    """`status`'s exit code: by state, and ready on a fallback rung its own condition (10), so a
    check that wants the preferred configuration sees that it failed (issue 38)."""
    code = state_exit(status.get("state"))
    index = status.get("rung_index")
    if code == EXIT_OK and isinstance(index, int) and index > 0:
        return EXIT_FALLBACK
    return code


@dataclass(frozen=True)
class Before:
    """The status when the command was sent, to tell a new server from the old one."""

    state: str
    started_at: str | None

    @classmethod
    def of(cls, status: Mapping[str, Any]) -> Before:
        started = status.get("started_at")
        return cls(str(status.get("state")), str(started) if started else None)


@dataclass(frozen=True)
class Settled:
    code: int
    message: str


def settled(verb: Verb, before: Before, now: Mapping[str, Any], moved: bool) -> Settled | None:
    """The outcome once `now` shows the command done, else None. `moved`: a status since the
    command showed another state than `before` (the command has taken effect)."""
    state = str(now.get("state"))
    if verb == "stop":
        return _stopped(now) if state == "stopped" else None
    started = now.get("started_at")
    new_server = bool(started) and str(started) != before.started_at
    if new_server and state in SERVING:
        pid = now.get("pid")
        if verb == "promote" and now.get("rung_index"):  # the preferred rung failed: back on the one that served
            return Settled(status_exit(now), f"{state} on rung {now.get('rung')}, pid {pid}: the preferred rung failed")
        return Settled(state_exit(state), f"{state} on rung {now.get('rung')}, pid {pid}")
    if state == "failed" and (moved or new_server):
        return Settled(EXIT_FAILED, f"failed: {now.get('reason') or 'see sglang-supervisor events'}")
    if state == "stopped" and (moved or new_server):
        return Settled(EXIT_STOPPED, f"stopped: {now.get('reason') or '-'}")
    return None


def _stopped(now: Mapping[str, Any]) -> Settled:
    stop = now.get("last_stop")
    if not isinstance(stop, Mapping):
        return Settled(EXIT_OK, "stopped (no server was running)")
    problems = []
    if stop.get("survivors"):
        problems.append(f"{stop['survivors']} process(es) of the tree survived")
    if stop.get("port_free") is False:
        problems.append("the server port is still held")
    gpu = stop.get("gpu_released")
    if gpu == "held":
        problems.append("GPU memory is still held by the old tree")
    if problems:
        return Settled(EXIT_ERROR, "stopped, but " + "; ".join(problems) + " (sglang-supervisor events)")
    if gpu == "unverified":
        return Settled(EXIT_OK, "stopped; port free; GPU release unverified (NVML unavailable here)")
    return Settled(EXIT_OK, "stopped; port free, GPU memory released (verified by NVML)")
