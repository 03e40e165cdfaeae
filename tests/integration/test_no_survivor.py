"""No survivor: a descendant that leaves the session and clears its environment is still stopped,
through the running daemon, with a cgroup per launch and, where cgroups are not writable, as an
orphan re-parented to the daemon (PR_SET_CHILD_SUBREAPER)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from statedir import events

from probes.ports import port_accepts
from supervisor.process.cgroup import CgroupRoot
from supervisor.root import serve as runner

pytestmark = pytest.mark.integration

# The server's main process forks a helper that leaves its session, forks again (so it is nobody's
# child) and re-execs with an empty environment (no marker), then holds the server port.
SERVER = r"""
import os, sys, time
port = sys.argv[sys.argv.index("--port") + 1]
pidfile = os.environ["ESCAPEE_PIDFILE"]
HOLD = (
    "import socket, sys, time, os\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(8)\n"
    "open(sys.argv[2], 'w').write(str(os.getpid()))\n"
    "time.sleep(3600)\n"
)
if os.fork() == 0:
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.execve(sys.executable, [sys.executable, "-c", HOLD, port, pidfile], {})
print("main process up", flush=True)
time.sleep(3600)
"""


def escapee_settings(sim: Any, tmp_path: Path) -> Any:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    s = sim("ok", tp=1)
    env = {**s.server.env, "ESCAPEE_PIDFILE": str(tmp_path / "escapee.pid")}
    server = s.server.model_copy(update={"command": (sys.executable, str(script)), "env": env})
    return s.model_copy(update={"server": server})


async def wait_escapee(r: Any, tmp_path: Path, port: int) -> int:
    pidfile = tmp_path / "escapee.pid"
    await r.wait_for(lambda _: pidfile.exists() and pidfile.read_text().strip() != "", 30, "the escapee")
    await r.wait_for(lambda _: port_accepts("127.0.0.1", port), 10, "the escapee listening")
    pid = int(pidfile.read_text())
    env = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"SGLANG_SUPERVISOR_MARKER" not in env, "the escapee carries no marker"
    return pid


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cgroup_dir(pid: int) -> Path:
    """The cgroup v2 directory of `pid`, as /proc and the mount table show it to anyone."""
    rel = next(x[3:] for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if x.startswith("0::"))
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4]) / rel.lstrip("/")
    raise AssertionError("no cgroup2 mount")


async def post(r: Any, path: str) -> None:
    async with httpx.AsyncClient(timeout=90) as c:
        resp = await c.post(f"{r.api}{path}", json={})
    assert resp.status_code == 202, resp.text


async def stop_and_check(r: Any, pid: int) -> dict[str, Any]:
    await post(r, "/stop")
    await r.wait_for(lambda x: x.state == "stopped", 60, "stopped")
    stopped = [e for e in events(r.settings.state_dir) if e["event"] == "server_stopped"][-1]
    return stopped


cgroup_root, cgroup_why = CgroupRoot.find()


@pytest.mark.skipif(cgroup_root is None, reason=f"cgroup v2 not writable here: {cgroup_why}")
async def test_escapee_is_stopped_with_the_launch_cgroup(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = escapee_settings(sim, tmp_path)
    r = await daemon(s)
    pid = await wait_escapee(r, tmp_path, s.server.port)
    cg = cgroup_dir(r.snap().pid)
    assert cg.name.startswith("sglang-server-") and cgroup_dir(pid) == cg, "the escapee is still in the launch's cgroup"
    stopped = await stop_and_check(r, pid)
    assert not alive(pid) and stopped["survivors"] == [] and stopped["port_free"] is True
    assert not cg.exists(), "the launch cgroup is removed"
    contained = [e for e in events(r.settings.state_dir) if e["event"] == "containment"]
    assert contained and contained[0]["cgroup_in_use"] is True and contained[0]["subreaper"] is True


async def test_escapee_is_stopped_as_an_orphan_without_cgroups(daemon, sim, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(runner.CgroupRoot, "find", classmethod(lambda cls: (None, "not writable (test)")))
    s = escapee_settings(sim, tmp_path)
    r = await daemon(s)
    (contained,) = [e for e in events(r.settings.state_dir) if e["event"] == "containment"]
    assert contained["cgroup_in_use"] is False and contained["subreaper"] is True
    pid = await wait_escapee(r, tmp_path, s.server.port)
    assert int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid(), "re-parented"
    stopped = await stop_and_check(r, pid)
    assert not alive(pid) and stopped["survivors"] == [] and stopped["port_free"] is True


async def test_without_either_the_escapee_survives_and_holds_the_port(daemon, sim, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The control: what the two defences above prevent (and what the stop record then says)."""
    monkeypatch.setattr(runner.CgroupRoot, "find", classmethod(lambda cls: (None, "not writable (test)")))
    monkeypatch.setattr(runner, "become_subreaper", lambda: False)
    s = escapee_settings(sim, tmp_path)
    r = await daemon(s)
    pid = await wait_escapee(r, tmp_path, s.server.port)
    try:
        stopped = await stop_and_check(r, pid)
        assert alive(pid) and stopped["port_free"] is False
        assert pid in stopped["port_holders"], "the stop record names who holds the port"
        assert f"pid {pid} (python" in stopped["port_held_by"]
        # A launch onto the busy port is refused with the holder named, and retried with a backoff.
        await post(r, "/start")
        snap = await r.wait_for(lambda x: x.state == "restarting" and "held by" in x.reason, 20, "refused")
        assert f"pid {pid}" in snap.reason and snap.next_attempt_in_s is not None
        await r.wait_for(
            lambda _: sum(e["event"] == "launch_refused" for e in events(r.settings.state_dir)) >= 2, 20, "retried"
        )
        refused = [e for e in events(r.settings.state_dir) if e["event"] == "launch_refused"]
        assert refused[1]["backoff_s"] > refused[0]["backoff_s"] > 0, "a growing backoff, not a loop"
        assert not any(e["event"] == "server_launched" for e in events(r.settings.state_dir)[-len(refused) :])
        metrics = await asyncio.to_thread(lambda: httpx.get(f"{r.api}/metrics", timeout=5).text)
        line = next(
            x
            for x in metrics.splitlines()
            if x.startswith('sglang_supervisor_launches_refused_total{reason="port_busy"}')
        )
        assert float(line.rsplit(" ", 1)[1]) >= len(refused)  # counted as journalled (one more may be in flight)
    finally:
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # the test process is a subreaper now: no zombie left behind
        (tmp_path / "escapee.pid").unlink(missing_ok=True)
    snap = await r.wait_for(lambda x: x.state == "starting", 30, "launched once the port is free")
    # Without either defence the relaunched server escapes again: end that one by hand too, so the
    # control case leaves no process (and no log keeper waiting on its pipe) behind the suite.
    again = await wait_escapee(r, tmp_path, s.server.port)
    await stop_and_check(r, again)
    os.kill(again, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(again, 0)
