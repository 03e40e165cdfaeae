"""SGLang's own watchdog fired: a hang SGLang itself judged, not a crash. Pure.

SGLang 0.5.16's scheduler watchdog logs one py-spy pass of itself, then `Scheduler watchdog timeout
(...)`, and five seconds later has its main process kill the tree. Whether the daemon reads that
line while the tree still lives or only after it is gone, the incident is the stall SGLang saw
(`serving_stall` while serving, `startup_stall` while starting), its reason says SGLang's watchdog
fired, and its stall class comes from SGLang's own dump (docs/DECISIONS.md "SGLang's watchdog").
A soft watchdog (`--soft-watchdog-timeout`) only dumps: no incident from it alone.
"""

from __future__ import annotations

from typing import Literal

from probes.busy import parse_active_threads
from probes.types import BusyThread, Observation, PyFrame, SGLangWatchdogFire
from supervisor.policy.gpuwait import thread_kind, where
from supervisor.status.causes import Cause

StallClass = Literal["idle", "busy"]
Mode = Literal["starting", "serving"]


def dump_threads(fire: SGLangWatchdogFire) -> tuple[BusyThread, ...]:
    """The active threads of SGLang's dumps, innermost frame first (Python frames only)."""
    out: list[BusyThread] = []
    for pid, text in fire.dumps:
        for t in parse_active_threads(pid, text):
            py = tuple(PyFrame(f.function, f.file, f.line, f.code) for f in t.frames if f.file.endswith(".py"))
            out.append(BusyThread(t.pid, t.tid, t.name, py))
    return tuple(out)


def dump_class(fire: SGLangWatchdogFire) -> tuple[StallClass, str]:
    """busy when a dumped thread was active (in a GPU wait or at work), else idle; and the frame."""
    active = [t for t in dump_threads(fire) if thread_kind(t) != "idle"]
    waits = [t for t in active if thread_kind(t) == "gpu_wait"]
    if waits:
        return "busy", where(waits[0])
    if active:
        return "busy", where(active[0])
    return "idle", ""


# What SGLang prints *because* a rank failed, not why: its SIGQUIT handling, and the main process's
# EOFError when a scheduler died before reporting ready (`_launch_subprocesses` reads its pipe).
_CRASH_CHATTER = ("Received sigquit from a child", "SIGQUIT received", "Triggering SIGQUIT for cleanup")


def _consequence(err: str) -> bool:
    return any(c in err for c in _CRASH_CHATTER) or err.split(": ", 1)[-1].strip() == "EOFError"


def crash_error(errors: tuple[str, ...]) -> str | None:
    """The newest error in the log that is not a consequence of another: why the tree went down."""
    for err in reversed(errors):
        if not _consequence(err):
            return err
    return None


def fired(obs: Observation) -> SGLangWatchdogFire | None:
    fire = obs.sglang_watchdog
    return fire if fire is not None and not fire.soft else None


def reason(fire: SGLangWatchdogFire, tree_alive: bool) -> str:
    after = f" after {fire.timeout_s:g} s" if fire.timeout_s is not None else ""
    dumps = f", its py-spy dump of {len(fire.dumps)} process(es) is in the log" if fire.dumps else ""
    failed = f", its py-spy failed ({fire.dump_errors[-1]})" if fire.dump_errors and not fire.dumps else ""
    gone = "; SGLang killed its own tree" if not tree_alive else ""
    return f"SGLang's own watchdog fired ({fire.name} watchdog timeout{after}){dumps}{failed}{gone}"


def cause_for(mode: Mode) -> Cause:
    return "serving_stall" if mode == "serving" else "startup_stall"
