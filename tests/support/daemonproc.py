"""The daemon as systemd runs it, for integration tests: a real `sglang-supervisor run` process,
its `GET /status` polled until it matches, and the cleanup of its server tree after a failure."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from supervisor.common.waiting import wait_for


def start(cfg: Path, env: dict[str, str], prefix: list[str] | None = None) -> subprocess.Popen[bytes]:
    cmd = [*(prefix or []), sys.executable, "-m", "supervisor", "run", "--config", str(cfg), "--log-json"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def status(api: str) -> dict[str, Any] | None:
    """`GET /status`, or None while the daemon does not answer."""
    try:
        return httpx.get(f"{api}/status", timeout=2).json()  # type: ignore[no-any-return]
    except httpx.HTTPError:
        return None


def wait_status(
    api: str, pred: Callable[[dict[str, Any]], bool], timeout: float, proc: subprocess.Popen[bytes] | None = None
) -> dict[str, Any]:
    """The first `GET /status` that `pred` holds for; fails at once when the daemon `proc` exits."""

    def read() -> dict[str, Any] | None:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"daemon exited {proc.returncode}")
        return status(api)

    return wait_for(read, pred, timeout, what="matching status")


def marked(marker: str) -> list[int]:
    """The pids of every process whose environment carries the daemon's `marker`."""
    found = []
    for p in psutil.process_iter():
        try:
            if f"SGLANG_SUPERVISOR_MARKER={marker}".encode() in Path(f"/proc/{p.pid}/environ").read_bytes():
                found.append(p.pid)
        except OSError:
            continue
    return found


def marker_of(pid: int | None) -> str | None:
    """The daemon's marker in the environment of server process `pid` (as `ps e` shows it)."""
    if pid is None:
        return None
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = b"SGLANG_SUPERVISOR_MARKER="
    return next((v[len(prefix) :].decode() for v in env if v.startswith(prefix)), None)


def cleanup(proc: subprocess.Popen[bytes], state_dir: str) -> None:
    """After a failure: the daemon may be gone, its server tree (in its own session) must go too."""
    from supervisor.process import kill_marked

    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    try:
        marker = json.loads((Path(state_dir) / "state.json").read_text())["marker"]
    except (OSError, ValueError, KeyError):
        return
    kill_marked(marker, grace_s=0.5)
    from supervisor.process.cgroup import CgroupRoot

    root, _ = CgroupRoot.find()  # the daemon ran in this test's cgroup: its launch cgroup is below it
    for cg in root.leftovers_of(marker) if root is not None else ():
        cg.kill_and_remove(2.0)
