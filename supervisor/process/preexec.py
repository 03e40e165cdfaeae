"""What the forked server child does before exec: join its launch cgroup, drop ambient capabilities.

Kept to the minimum: code between fork and exec in a threaded process must not take locks.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4


def libc_prctl() -> Callable[..., int] | None:
    """prctl(2) from the C library with its five-argument signature; None where it cannot be loaded."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl  # type: ignore[no-any-return]


def _has_ambient_caps() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapAmb:"):
                    return int(line.split()[1], 16) != 0
    except (OSError, ValueError, IndexError):
        pass
    return False


def ambient_dropper() -> Callable[[], None] | None:
    """A pre-exec hook clearing ambient capabilities (CAP_SYS_PTRACE is for the dump tools only).

    Only built when the daemon has ambient capabilities: a pre-exec hook forces fork instead of
    vfork and runs Python code in the child of a threaded process, so it is avoided when useless.
    """
    prctl = libc_prctl() if _has_ambient_caps() else None
    if prctl is None:
        return None

    def drop() -> None:
        prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # failure ignored: best effort

    return drop


def pre_exec(drop_caps: Callable[[], None] | None, cgroup_fd: int | None) -> Callable[[], None] | None:
    """The forked child's last steps before exec: join the launch's cgroup (one write to an fd the
    parent opened, so nothing is imported or locked between fork and exec), drop caps. A refused join
    leaves the server outside the cgroup rather than not started."""
    if cgroup_fd is None:
        return drop_caps

    def pre() -> None:
        try:  # noqa: SIM105 - the least code possible between fork and exec
            os.write(cgroup_fd, b"0")
        except OSError:
            pass  # refused (e.g. controllers enabled in the parent): the marker and the subreaper remain
        if drop_caps is not None:
            drop_caps()

    return pre
