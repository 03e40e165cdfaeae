"""The log keeper killed or stopped (issue 27, item 4): real daemons, keepers, pipes and signals.

The attack: after `kill -9` of the keeper (daemon up or down) all server output was lost until the
next launch and nothing said so; a SIGSTOPped keeper blocked the server on a full pipe, caught as a
hang of class `unknown`. Now a dead keeper is replaced on the same pipe within a poll (journalled,
counted in /status and /metrics), and a stopped one is named in the incident.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest
from daemonproc import cleanup, start, wait_status
from statedir import events, server_log
from waiting import wait_for

from supervisor.config.render import dump_toml as to_toml

pytestmark = pytest.mark.integration
ACCESS = re.compile(r'"POST /generate\?(\S+) HTTP/1\.1" 200')


def generate(port: int, tag: str) -> int:
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 4}}
    return httpx.post(f"http://127.0.0.1:{port}/generate?{tag}", json=body, timeout=10).status_code


def _keeper_on(server_pid: int) -> int | None:
    pipe = os.readlink(f"/proc/{server_pid}/fd/1")
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "supervisor.logs.keeper" in (p.info["cmdline"] or []) and os.readlink(f"/proc/{p.pid}/fd/0") == pipe:
                return p.pid
        except OSError:
            continue
    return None


def keeper_of(server_pid: int, timeout: float = 10.0) -> int:
    # A keeper just spawned shows its parent's cmdline and fds until it has exec'd (seconds on a
    # loaded machine): look until it is there.
    deadline = time.monotonic() + timeout
    while (pid := _keeper_on(server_pid)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid is None:
        raise AssertionError("no keeper on the server's pipe")
    return pid


async def test_a_keeper_killed_while_the_daemon_runs_is_replaced_and_no_line_is_lost(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    s = sim("ok", tp=1)
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.state == "ready" and x.log_keeper is not None, 30, "ready")
    pid = snap.pid
    old = snap.log_keeper.pid
    assert old == keeper_of(pid)
    os.kill(old, signal.SIGKILL)
    # Lines the server writes at once (before any poll) wait in the pipe: the daemon holds a read end.
    codes = [await asyncio.to_thread(generate, s.server.port, f"during={i}") for i in range(3)]
    snap = await r.wait_for(
        lambda x: x.log_keeper is not None and x.log_keeper.replaced == 1, 10, "the keeper replaced"
    )
    new = snap.log_keeper.pid
    assert new not in (None, old) and new == await asyncio.to_thread(keeper_of, pid)
    codes += [await asyncio.to_thread(generate, s.server.port, f"after={i}") for i in range(3)]
    assert codes == [200] * 6
    state_dir = Path(s.paths.state_dir)
    want = {f"during={i}" for i in range(3)} | {f"after={i}" for i in range(3)}
    assert await asyncio.to_thread(wait_for, lambda: want <= set(ACCESS.findall(server_log(state_dir))), 10)
    ev = [e for e in events(state_dir) if e["event"] == "log_keeper_replaced"]
    assert len(ev) == 1 and ev[0]["old_pid"] == old and ev[0]["pid"] == new and "signal 9" in ev[0]["why"]
    async with httpx.AsyncClient(timeout=5) as c:
        metrics = (await c.get(f"{r.api}/metrics")).text
        status = (await c.get(f"{r.api}/status")).json()
    assert "sglang_supervisor_log_keeper_replaced_total 1.0" in metrics
    assert status["log_keeper"]["replaced"] == 1 and status["log_keeper"]["pid"] == new
    assert r.snap().pid == pid and r.snap().restarts == 0  # no server restart


def test_a_keeper_killed_while_no_daemon_runs_is_replaced_by_the_successor(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    state_dir = Path(s.paths.state_dir)
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    try:
        pid = wait_status(api, lambda x: x["state"] == "ready", 40, proc)["pid"]
        proc.kill()
        proc.wait(10)
        old = keeper_of(pid)
        os.kill(old, signal.SIGKILL)  # daemon down, keeper down: nothing reads the pipe now
        time.sleep(0.3)
        proc = start(cfg, dict(os.environ))
        st = wait_status(
            api, lambda x: x["state"] == "ready" and (x.get("log_keeper") or {}).get("replaced") == 1, 40, proc
        )
        assert st["pid"] == pid and st["restarts"] == 0  # adopted, not reloaded
        new = keeper_of(pid)
        assert new != old and st["log_keeper"]["pid"] == new
        assert [generate(s.server.port, f"later={i}") for i in range(3)] == [200] * 3
        assert wait_for(lambda: {f"later={i}" for i in range(3)} <= set(ACCESS.findall(server_log(state_dir))), 10)
        assert any(e["event"] == "log_keeper_replaced" and e["old_pid"] is None for e in events(state_dir))
    finally:
        cleanup(proc, str(state_dir))


async def test_a_stopped_keeper_is_named_when_the_server_blocks_on_its_output(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        "ok",
        tp=1,
        watchdog={"health_failures": 2, "health_interval_s": 0.5, "health_timeout_s": 2.0, "serving_stall_s": 60.0},
        diagnostics={"py_spy": False},
    )
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.state == "ready" and x.log_keeper is not None, 30, "ready")
    keeper = snap.log_keeper.pid
    os.kill(keeper, signal.SIGSTOP)
    try:
        await r.wait_for(
            lambda x: x.log_keeper is not None and x.log_keeper.condition == "stopped", 10, "named stopped"
        )
        # Fill the pipe the way a busy server does: request lines until its writes block.
        import asyncio

        async def hammer() -> None:
            async with httpx.AsyncClient(timeout=1) as c:
                for i in range(100000):
                    try:
                        await c.get(f"http://127.0.0.1:{s.server.port}/get_model_info?{'x' * 4000}{i}")
                    except httpx.HTTPError:
                        return

        task = asyncio.create_task(hammer())
        snap = await r.wait_for(lambda x: x.last_incident is not None, 60, "the blocked server's incident")
        task.cancel()
        detail = snap.last_incident.detail
        assert f"log keeper (pid {keeper}) is stopped" in detail and "full" in detail, detail
        ev = events(Path(s.paths.state_dir))
        assert any(e["event"] == "log_keeper_stopped" and e["pid"] == keeper for e in ev)
        # The evidence bundle carries the same verdict, so whoever reads it sees the cause too.
        bundle = snap.last_incident.bundle
        assert bundle is not None
        verdict = (Path(s.paths.state_dir) / "diagnostics" / bundle / "verdict.json").read_text()
        assert f"log keeper (pid {keeper}) is stopped" in verdict
        text = (Path(s.paths.state_dir) / "diagnostics" / bundle / "summary.txt").read_text()
        why = next(line for line in text.splitlines() if line.startswith("Why: "))  # after the culprit (issue 35)
        assert f"log keeper (pid {keeper}) is stopped" in why, text
    finally:
        os.kill(keeper, signal.SIGCONT)
