"""What one image of the daemon leaves the next across the SIGUSR2 re-exec: the API's listening
socket and the state directory's flock'd descriptor.

Before this (issue 50) the old image closed the API's socket and dropped the lock before `execv`,
and the new image bound the port and took the lock again: a local user looping `bind()` on the
port won that gap, the new image exited 2 and the squatter was sent the bearer token by the next
`sglang-supervisor status`. Now both descriptors stay open across the exec (as systemd's socket
activation passes `LISTEN_FDS` and gunicorn `GUNICORN_FD`): the old image clears their close-on-exec
flag and names them in two environment variables; the new image takes the variables out of its
environment first thing (so neither the server, the log keeper nor a hook ever sees them), checks
that each descriptor is what the variable says (the same listening address; the same lock file,
still locked) and marks it close-on-exec again. A variable meant for another process (another pid),
or a descriptor that is not what it claims, is closed and the daemon binds and locks afresh.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import MutableMapping
from dataclasses import dataclass

LISTEN_ENV = "SGLANG_SUPERVISOR_LISTEN_FDS"
LOCK_ENV = "SGLANG_SUPERVISOR_LOCK_FD"
# What the handoff's preflight is told: the address the running daemon listens on (host port).
HANDOFF_API_ENV = "SGLANG_SUPERVISOR_HANDOFF_API"
ENV_KEYS = (LISTEN_ENV, LOCK_ENV, HANDOFF_API_ENV)
# The preflight says this when the new code takes both descriptors over; a daemon whose successor
# does not say it refuses the handoff rather than free the port (an older version on disk).
TAKES_OVER = "takes over the API socket and the state-directory lock"


@dataclass(frozen=True)
class PassedListener:
    fd: int
    host: str  # as configured ([api] host), which the new image compares with its own
    port: int


@dataclass(frozen=True)
class PassedLock:
    fd: int
    dev: int
    ino: int


@dataclass(frozen=True)
class Inherited:
    """What the previous image of this very process passed on; `ignored`: why a variable was not used."""

    listener: PassedListener | None = None
    lock: PassedLock | None = None
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True)
class Handover:
    """What the old image keeps open for the next one (its descriptors still close-on-exec until `exec_env`)."""

    listener: PassedListener | None
    lock: PassedLock | None


def _fields(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in value.split(","):
        key, sep, val = part.partition("=")
        if sep:
            out[key.strip()] = val.strip()
    return out


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() and len(text) < 20 else None


def parse_listener(value: str, pid: int) -> PassedListener | str:
    """`pid=P,fd=N,port=X,host=H` -> the listener, or why not (a value for another pid, a bad one)."""
    f = _fields(value)
    fd, port, owner = _number(f.get("fd")), _number(f.get("port")), _number(f.get("pid"))
    if owner != pid:
        return f"{LISTEN_ENV} is for pid {f.get('pid')!r}, not this process ({pid})"
    if fd is None or fd < 3 or port is None or not 0 < port < 65536 or not f.get("host"):
        return f"{LISTEN_ENV} is malformed: {value[:120]!r}"
    return PassedListener(fd, f["host"], port)


def parse_lock(value: str, pid: int) -> PassedLock | str:
    """`pid=P,fd=N,dev=D,ino=I` -> the lock's descriptor, or why not."""
    f = _fields(value)
    fd, dev, ino, owner = (_number(f.get(k)) for k in ("fd", "dev", "ino", "pid"))
    if owner != pid:
        return f"{LOCK_ENV} is for pid {f.get('pid')!r}, not this process ({pid})"
    if fd is None or fd < 3 or dev is None or ino is None:
        return f"{LOCK_ENV} is malformed: {value[:120]!r}"
    return PassedLock(fd, dev, ino)


def take(environ: MutableMapping[str, str], pid: int) -> Inherited:
    """Take the variables out of `environ` (the process's own: nothing spawned later inherits
    them) and say what they pass. A variable for another pid names no descriptor of ours: it is
    dropped and its descriptor left alone."""
    listen, lock = environ.pop(LISTEN_ENV, None), environ.pop(LOCK_ENV, None)
    environ.pop(HANDOFF_API_ENV, None)
    ignored: list[str] = []
    listener = parse_listener(listen, pid) if listen is not None else None
    if isinstance(listener, str):
        ignored.append(listener)
        listener = None
    held = parse_lock(lock, pid) if lock is not None else None
    if isinstance(held, str):
        ignored.append(held)
        held = None
    return Inherited(listener, held, tuple(ignored))


def exec_env(handover: Handover, pid: int) -> dict[str, str]:
    """The variables naming what `handover` keeps, its descriptors made inheritable: the last
    step before `execv` (nothing is spawned after it)."""
    out: dict[str, str] = {}
    if handover.listener is not None:
        p = handover.listener
        os.set_inheritable(p.fd, True)
        out[LISTEN_ENV] = f"pid={pid},fd={p.fd},port={p.port},host={p.host}"
    if handover.lock is not None:
        k = handover.lock
        os.set_inheritable(k.fd, True)
        out[LOCK_ENV] = f"pid={pid},fd={k.fd},dev={k.dev},ino={k.ino}"
    return out


def close_fd(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def adopt_listener(passed: PassedListener, host: str, port: int) -> socket.socket | str:
    """The inherited listening socket, close-on-exec again and non-blocking, when it is a TCP
    socket listening on the configured `host`:`port`; else why not (the descriptor is closed)."""
    if (passed.host, passed.port) != (host, port):
        close_fd(passed.fd)
        return f"it listened on {passed.host}:{passed.port}, the configuration says {host}:{port}"
    try:
        sock = socket.socket(fileno=passed.fd)
    except OSError as err:
        close_fd(passed.fd)
        return f"descriptor {passed.fd} is not a socket ({err.strerror or err})"
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        bound = sock.getsockname()
        stream = sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
    except OSError as err:
        sock.close()
        return f"descriptor {passed.fd}: {err.strerror or err}"
    if not (listening and stream and isinstance(bound, tuple) and bound[1] == port):
        sock.close()
        return f"descriptor {passed.fd} is not a TCP socket listening on port {port} ({bound!r})"
    sock.set_inheritable(False)
    sock.setblocking(False)
    return sock
