"""What every SGLang child does first, and the background thread every real process has."""

from __future__ import annotations

import ctypes
import faulthandler
import signal
import threading
import time

import setproctitle

PR_SET_PDEATHSIG = 1


def kill_itself_when_parent_died() -> None:
    """PR_SET_PDEATHSIG=SIGKILL through libc's prctl, exactly as SGLang's children do."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except OSError:
        pass


def become_child(title: str, ignore_sigterm: bool) -> None:
    setproctitle.setproctitle(title)
    kill_itself_when_parent_died()
    faulthandler.enable()  # SGLang's schedulers print a fatal-error dump on SIGSEGV
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _watchdog_heartbeat_loop(stop: threading.Event, period_s: float) -> None:
    # Like torch's NCCL watchdog/heartbeat monitor: wakes often, does a little, touches a few KB, so
    # a hung process is never perfectly still (CPU ticks, minor faults) -- as on real hardware.
    scratch = bytearray(4096)
    beat = 0
    while not stop.wait(period_s):
        beat += 1
        buf = bytes(8192)  # a fresh allocation each beat
        scratch[beat % len(scratch)] = (beat + len(buf)) & 0xFF
        _ = sum(scratch[:256])


def start_heartbeat(name: str, period_s: float = 0.1) -> threading.Event:
    stop = threading.Event()
    thread = threading.Thread(target=_watchdog_heartbeat_loop, args=(stop, period_s), name=name, daemon=True)
    thread.start()
    return stop


def sleep_forever() -> None:
    while True:
        time.sleep(3600)
