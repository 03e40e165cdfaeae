"""Evidence from /proc that needs no tool and stops nothing: status, threads, kernel stacks, ports."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import psutil

from probes.types import ThreadInfo
from supervisor.common.redact import Redactor

PROC = Path("/proc")
_MAX_THREADS = 2048  # a runaway thread count must not make the capture slow


@dataclass(frozen=True)
class ProcSnapshot:
    pid: int
    alive: bool
    status: str = ""  # /proc/<pid>/status as text
    cmdline: tuple[str, ...] = ()
    environ: tuple[tuple[str, str], ...] = ()  # raw: redact before writing
    threads: tuple[ThreadInfo, ...] = ()
    kernel_stacks: tuple[tuple[int, str], ...] = ()  # (tid, /proc/<pid>/task/<tid>/stack) where readable
    listening: tuple[str, ...] = ()  # "127.0.0.1:30000"
    errors: tuple[str, ...] = ()


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def _thread(task: Path) -> ThreadInfo | None:
    try:
        stat = _read(task / "stat")
        tid = int(task.name)
    except (OSError, ValueError):
        return None
    # `tid (comm) S ...`: comm may itself hold ") ", so split at the last parenthesis.
    close = stat.rfind(")")
    name = stat[stat.find("(") + 1 : close]
    fields = stat[close + 2 :].split()
    state = fields[0] if fields else ""
    try:
        wchan = _read(task / "wchan").strip()
    except OSError:
        wchan = ""
    return ThreadInfo(tid=tid, name=name, state=state, wchan=wchan)


def sample_threads(pid: int, proc_root: Path = PROC) -> tuple[ThreadInfo, ...]:
    """State letter, name and wait channel of every thread; () when the process is gone."""
    try:
        tasks = sorted(
            (proc_root / str(pid) / "task").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0
        )
    except OSError:
        return ()
    out = [t for t in (_thread(task) for task in tasks[:_MAX_THREADS]) if t is not None]
    return tuple(out)


def _listening(pid: int) -> tuple[str, ...]:
    conns = psutil.Process(pid).net_connections(kind="inet")
    return tuple(
        sorted(f"{c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN and c.laddr)
    )


def read_proc(pid: int, proc_root: Path = PROC, *, kernel_stacks: bool = True) -> ProcSnapshot:
    base = proc_root / str(pid)
    errors: list[str] = []
    try:
        status = _read(base / "status")
    except OSError as err:
        return ProcSnapshot(pid=pid, alive=False, errors=(f"status: {err.strerror or err}",))
    cmdline: tuple[str, ...] = ()
    environ: tuple[tuple[str, str], ...] = ()
    try:
        cmdline = tuple(a for a in _read(base / "cmdline").split("\0") if a)
    except OSError as err:
        errors.append(f"cmdline: {err.strerror or err}")
    try:
        pairs = (e.partition("=") for e in _read(base / "environ").split("\0") if e)
        environ = tuple((k, v) for k, _, v in pairs)
    except OSError as err:
        errors.append(f"environ: {err.strerror or err}")
    threads = sample_threads(pid, proc_root)
    stacks: list[tuple[int, str]] = []
    if kernel_stacks:
        for t in threads:
            # Readable only with CAP_SYS_ADMIN; the wchan still says where otherwise.
            with contextlib.suppress(OSError):
                stacks.append((t.tid, _read(base / "task" / str(t.tid) / "stack")))
    listening: tuple[str, ...] = ()
    if proc_root == PROC:
        try:
            listening = _listening(pid)
        except (psutil.Error, OSError) as err:
            errors.append(f"listening sockets: {err}")
    return ProcSnapshot(pid, True, status, cmdline, environ, threads, tuple(stacks), listening, tuple(errors))


def render_proc(snap: ProcSnapshot, redactor: Redactor) -> str:
    """proc-<pid>.txt: everything above, the environment and command line redacted."""
    if not snap.alive:
        return f"pid {snap.pid}: gone ({'; '.join(snap.errors)})\n"
    lines = [f"pid {snap.pid}", f"cmdline: {' '.join(redactor.argv(snap.cmdline))}"]
    lines.append(f"listening: {', '.join(snap.listening) or 'none'}")
    lines += ["", "== threads (tid state wchan name) =="]
    lines += [f"{t.tid:>8} {t.state or '?'} {t.wchan or '-':<28} {t.name}" for t in snap.threads]
    lines += ["", "== /proc/<pid>/status ==", snap.status.rstrip()]
    stacks = dict(snap.kernel_stacks)
    if stacks:
        lines += ["", "== kernel stacks (/proc/<pid>/task/<tid>/stack) =="]
        for tid, text in stacks.items():
            lines.append(f"-- tid {tid}")
            lines.append(text.rstrip() or "(empty: running in user space)")
    lines += ["", "== environment (redacted) =="]
    lines += [f"{k}={v}" for k, v in redactor.env(dict(snap.environ)).items()]
    if snap.errors:
        lines += ["", "== unreadable ==", *snap.errors]
    return redactor.text("\n".join(lines)) + "\n"
