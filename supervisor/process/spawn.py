"""Starting the server and the log keeper: the only places the daemon creates a process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Protocol

from probes.proctree import MARKER_ENV
from supervisor.process.cgroup import LaunchCgroup
from supervisor.process.preexec import ambient_dropper, pre_exec


class SpawnError(Exception):
    """The server could not be started; the message names the program and what to check."""


class ChildHandle(Protocol):
    """What a stop needs of the main process: its pid, and a non-blocking reap. ServerProcess is one."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...


class ServerProcess:
    """The launched main process of the server. Only `poll()` reaps it; nothing else may wait on it."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        argv: tuple[str, ...],
        marker: str,
        started_at: float,
        cgroup: LaunchCgroup | None = None,
    ):
        self._popen = popen
        self.argv = argv
        self.marker = marker
        self.started_at = started_at
        self.cgroup = cgroup  # the launch's own cgroup v2, when the daemon may make one

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        marker: str,
        cwd: str | None = None,
        *,
        output: int | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        cgroup: LaunchCgroup | None = None,
    ) -> ServerProcess:
        """Start `argv` in a new session with `env` plus the marker; stdout and stderr go to `output`.

        `output` is a file descriptor (the log keeper's pipe; the caller closes its copy); without
        it stdout and stderr are pipes of their own, read through `stdout` and `stderr`.

        `SPT_NOENV=1` and `PYTHONUNBUFFERED=1` are added unless `env` sets them: setproctitle
        would otherwise overwrite the environment block, hiding the marker in
        /proc/<pid>/environ, and a block-buffered stdout would hide progress from the log probe.
        """
        args = tuple(argv)
        if not args or not args[0]:
            raise SpawnError("cannot start the server: the command is empty (set [server] command)")
        if not marker:
            raise SpawnError("cannot start the server: the marker must not be empty")
        child_env = dict(env)
        child_env[MARKER_ENV] = marker
        child_env.setdefault("SPT_NOENV", "1")
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        attach = cgroup.attach_fd() if cgroup is not None else None
        try:
            popen = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if output is None else output,
                stderr=subprocess.PIPE if output is None else subprocess.STDOUT,
                env=child_env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=pre_exec(ambient_dropper(), attach),
                bufsize=0,
            )
        except OSError as e:
            raise SpawnError(_spawn_error_message(args[0], cwd, e)) from e
        finally:
            if attach is not None:
                os.close(attach)
        return cls(popen, args, marker, monotonic(), cgroup)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def stdout(self) -> IO[bytes]:
        assert self._popen.stdout is not None
        return self._popen.stdout

    @property
    def stderr(self) -> IO[bytes]:
        assert self._popen.stderr is not None
        return self._popen.stderr

    def poll(self) -> int | None:
        """The exit code once the main process ended (reaping it), -N when killed by signal N."""
        return self._popen.poll()

    def wait(self, timeout: float) -> int | None:
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def spawn_log_keeper(
    log_dir: str,
    file_name: str,
    max_bytes: int,
    backups: int,
    env: Mapping[str, str],
    extra: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start the log keeper on a new pipe; returns it, the pipe's write end (for the server) and a
    read end the daemon keeps (never read: it keeps the pipe readable for a replacement keeper).

    The keeper runs in a session of its own and without the server's marker: it is not part of
    the server tree (not stopped with it, not in its evidence); it ends by itself once every
    writer of the pipe is gone.
    """
    read_end, write_end = os.pipe()
    kept = os.dup(read_end)  # non-inheritable: neither the server nor any keeper gets it
    try:
        keeper = start_log_keeper(read_end, log_dir, file_name, max_bytes, backups, env, extra)
    except SpawnError:
        os.close(write_end)
        os.close(kept)
        raise
    finally:
        os.close(read_end)
    return keeper, write_end, kept


def start_log_keeper(
    read_fd: int,
    log_dir: str,
    file_name: str,
    max_bytes: int,
    backups: int,
    env: Mapping[str, str],
    extra: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """A log keeper reading `read_fd` (a new pipe's read end, or the daemon's copy for a replacement)."""
    argv = [sys.executable, "-m", "supervisor.logs.keeper", "--dir", log_dir, "--name", file_name]
    argv += ["--max-bytes", str(max_bytes), "--backups", str(backups), *extra]
    try:
        return subprocess.Popen(
            argv,
            stdin=read_fd,
            stdout=subprocess.DEVNULL,
            env=dict(env),
            cwd="/",  # holds no directory busy (an unmount, a deleted checkout)
            start_new_session=True,
            preexec_fn=ambient_dropper(),
        )
    except OSError as e:
        raise SpawnError(f"cannot start the log keeper ({sys.executable}): {e.strerror or e}") from e


def _spawn_error_message(program: str, cwd: str | None, e: OSError) -> str:
    if cwd is not None and e.filename == cwd:
        return f"cannot start the server: working directory {cwd!r}: {e.strerror} (check [server] cwd)"
    real = os.path.realpath(program) if os.sep in program else program
    shown = repr(program) if real == program else f"{program!r} (-> {real})"
    if isinstance(e, FileNotFoundError) and os.sep in program and os.path.lexists(program):
        return (
            f"cannot start the server: program {shown} exists but cannot be executed: its interpreter "
            f"(the #! line, or the Python a venv links to) is missing ({e.strerror}; check [server] command)"
        )
    if isinstance(e, FileNotFoundError):
        return f"cannot start the server: program {program!r} not found (check [server] command and PATH)"
    if isinstance(e, PermissionError):
        return (
            f"cannot start the server: program {shown} is not executable by uid {os.getuid()} ({e.strerror}); "
            "a venv built on a Python under /root or a home directory cannot be run by the service user"
        )
    return f"cannot start the server: program {program!r}: {e.strerror or e}"
