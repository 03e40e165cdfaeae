"""What every child of either engine does first, the background thread every real process has, and a
death by a real SIGSEGV."""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import itertools
import os
import resource
import signal
import sysconfig
import threading
import time
from typing import NoReturn

import setproctitle

PR_SET_PDEATHSIG = 1


def kill_itself_when_parent_died() -> None:
    """PR_SET_PDEATHSIG=SIGKILL through libc's prctl, exactly as SGLang's children do."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except OSError:
        pass


def scheduler_title(rank: int, tp_size: int) -> str:
    """`sglang::scheduler` at tp-size 1 (SGLang 0.5.16 adds `_TP{n}` only with tp-size > 1)."""
    return f"sglang::scheduler_TP{rank}" if tp_size > 1 else "sglang::scheduler"


def log_prefix(rank: int, tp_size: int) -> str:
    """The rank tag inside `[time TPn]`: none at tp-size 1, as configure_scheduler_process."""
    return f" TP{rank}" if tp_size > 1 else ""


@functools.lru_cache(maxsize=1)
def _stdlib_sources() -> tuple[str, ...]:
    paths = (
        os.path.join(root, name)
        for root, _, names in os.walk(sysconfig.get_paths()["stdlib"])
        for name in names
        if name.endswith(".py")
    )
    return tuple(itertools.islice(paths, 4000))


def import_sglang(seconds: float) -> list[bytes]:
    """What importing SGLang (torch, triton, transformers) looks like from /proc: no output, files
    read, CPU spent compiling, memory growing. Returns the "modules" so the memory stays held."""
    held: list[bytes] = []
    if seconds <= 0:
        return held
    deadline = time.monotonic() + seconds
    sources = _stdlib_sources()
    i = 0
    while time.monotonic() < deadline and sources:
        path = sources[i % len(sources)]
        i += 1
        try:
            with open(path, "rb") as f:
                code = f.read()
            if i % 8 == 0:  # most modules come from a .pyc; some compile
                compile(code, path, "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError):
            continue
        if i % 4 == 0 and len(held) < 256:  # up to ~64 MB, pages touched: a real import grows RSS by GBs
            held.append(b"\x01" * (256 * 1024))
    return held


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


def segfault() -> NoReturn:
    """A real SIGSEGV and nothing printed (a process without faulthandler, as vLLM's are)."""
    faulthandler.disable()  # its own dump would show this file's path
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in whatever the cwd is
    ctypes.string_at(0)
    os._exit(139)  # not reached: the read above faults
