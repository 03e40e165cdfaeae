"""check-config: SGLang's own watchdog against the daemon's windows.

SGLang kills its whole tree when a forward batch (and, in later releases, initialisation) makes no
progress for `--watchdog-timeout` seconds (default 300), after one py-spy pass of itself. If that
is shorter than the window in which the daemon would judge the same hang, SGLang acts first: the
daemon then sees a tree that died, with less evidence (no gdb, no cuda-gdb, no second py-spy) than
its own capture would have kept. Not an error: the daemon still reads SGLang's dump from the log.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from supervisor.config.render import render_rung
from supervisor.config.settings import Settings

SGLANG_DEFAULT_WATCHDOG_S = 300.0


class WatchdogFinding(NamedTuple):
    level: Literal["warning"]
    key: str
    message: str


def _timeout(argv: tuple[str, ...]) -> float | None:
    """The --watchdog-timeout in a rendered command line; None when absent or not a number."""
    for i, arg in enumerate(argv):
        value = None
        if arg == "--watchdog-timeout" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--watchdog-timeout="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return float(value)
            except ValueError:
                return None
    return None


def watchdog_findings(settings: Settings) -> list[WatchdogFinding]:
    wd = settings.watchdog
    windows = (("watchdog.serving_stall_s", wd.serving_stall_s), ("watchdog.startup_stall_s", wd.startup_stall_s))
    out: list[WatchdogFinding] = []
    seen: set[float] = set()
    for i, rung in enumerate(settings.ladder):
        argv = render_rung(settings.server, rung).argv
        value = _timeout(argv)
        given = value is not None
        timeout = value if value is not None else SGLANG_DEFAULT_WATCHDOG_S
        if i > 0 and (not given or timeout in seen):
            continue  # the base already reported this value
        seen.add(timeout)
        key = "server.args.watchdog-timeout" if i == 0 else f"fallback[{i - 1}] ({rung.name}).args.watchdog-timeout"
        for name, window in windows:
            if timeout < window:
                what = f"{timeout:g} s" + ("" if given else " (SGLang's default)")
                out.append(
                    WatchdogFinding(
                        "warning",
                        key,
                        f"SGLang's --watchdog-timeout {what} is shorter than [{name.replace('.', '] ', 1)} = "
                        f"{window:g} s: SGLang kills its own tree first (after one py-spy pass), leaving less "
                        f"evidence than the daemon's capture; set watchdog-timeout above {window:g} or lower "
                        f"{name.split('.', 1)[1]}",
                    )
                )
                break
    return out
