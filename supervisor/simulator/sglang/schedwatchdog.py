"""SGLang's scheduler watchdog (`--watchdog-timeout`, default 300 s; `managers/scheduler.py`): a forward
pass stuck longer than that makes the rank dump itself once with py-spy, log the timeout, and SIGQUIT
its main process, whose handler ends the tree. Every scheduler of every node runs one."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable

from supervisor.simulator.loglines import LogWriter
from supervisor.simulator.sglang.selfdump import pyspy_dump_self


def _watch(timeout: float, forward_since: Callable[[], float | None], log: LogWriter, main_pid: int) -> None:
    while True:
        time.sleep(max(0.1, timeout // 2))  # SGLang checks every timeout // 2 seconds
        since = forward_since()
        if since is not None and time.monotonic() - since > timeout:
            break
    pyspy_dump_self(log)
    log.error(f"Scheduler watchdog timeout (self.watchdog_timeout={timeout!r}, self.soft=False)")
    time.sleep(5)  # "so that the parent process can print the error"
    with contextlib.suppress(OSError):
        os.kill(main_pid, signal.SIGQUIT)


def start_watchdog(timeout: float, forward_since: Callable[[], float | None], log: LogWriter, main_pid: int) -> None:
    threading.Thread(target=_watch, args=(timeout, forward_since, log, main_pid), name="watchdog", daemon=True).start()
