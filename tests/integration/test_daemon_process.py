"""The daemon as systemd runs it: a real `sglang-supervisor run` process, the notify socket, signals."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from daemonproc import cleanup, marked, start, wait_status

from supervisor.config.render import dump_toml as to_toml

pytestmark = pytest.mark.integration


class NotifySocket:
    """A datagram socket standing in for systemd's, read by a thread so each message keeps its arrival time."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.path = path
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, BlockingIOError, OSError):
                continue
            self.messages.append((time.monotonic(), data.decode().strip()))

    def drain(self) -> list[tuple[float, str]]:
        time.sleep(0.1)
        return list(self.messages)

    def texts(self) -> list[str]:
        return [m for _, m in self.drain()]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def test_notify_protocol_and_sigterm_leave_nothing_behind(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=2)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    ns = NotifySocket(tmp_path / "notify.sock")
    # WatchdogSec=2 s: pings every 1 s, sent by the loop's first cycle (0.5 s polls) once one is due, so
    # a gap is 1-1.5 s; with 1 s the gaps sat at the 1 s limit itself and a loaded machine crossed it.
    env = {**os.environ, "NOTIFY_SOCKET": str(ns.path), "WATCHDOG_USEC": "2000000", "HF_TOKEN": "hf_secret"}
    # Give the daemon an ambient capability, as the unit file does: the server must not inherit it.
    prefix = ["setpriv", "--inh-caps=+sys_ptrace", "--ambient-caps=+sys_ptrace"] if shutil.which("setpriv") else []
    proc = start(cfg, env, prefix)
    api = f"http://127.0.0.1:{s.api.port}"
    try:
        st = wait_status(api, lambda x: x["state"] == "ready", 40, proc)
        server_pid = st["pid"]
        time.sleep(3.0)
        msgs = ns.texts()
        assert "READY=1" in msgs[:3]
        statuses = [m for m in msgs if m.startswith("STATUS=")]
        assert any("state=starting" in m for m in statuses) and any("state=ready" in m for m in statuses)
        pings = [t for t, m in ns.messages if m == "WATCHDOG=1"]
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        # Often enough that systemd would not restart a healthy daemon (under WATCHDOG_USEC), never a flood.
        assert len(pings) >= 4 and 0.5 <= sorted(gaps)[len(gaps) // 2] < 2.0, gaps
        child_env = Path(f"/proc/{server_pid}/environ").read_bytes()
        assert b"NOTIFY_SOCKET" not in child_env and b"WATCHDOG_USEC" not in child_env
        if prefix:
            daemon_caps = Path(f"/proc/{proc.pid}/status").read_text()
            child_caps = Path(f"/proc/{server_pid}/status").read_text()
            assert "CapAmb:\t0000000000000000" not in daemon_caps
            assert "CapAmb:\t0000000000000000" in child_caps
        marker = json.loads((Path(s.paths.state_dir) / "state.json").read_text())["marker"]
        tree = marked(marker)
        assert server_pid in tree and len(tree) >= 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "STOPPING=1" in ns.texts()
        assert [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"] == []
        assert marked(marker) == []
        with socket.socket() as probe:  # the server port is free for the next server (as uvicorn binds it)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", s.server.port))
    finally:
        cleanup(proc, s.paths.state_dir)
        ns.close()


def test_sighup_reloads_valid_config_and_refuses_invalid_one(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=2)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    ns = NotifySocket(tmp_path / "notify.sock")
    proc = start(cfg, {**os.environ, "NOTIFY_SOCKET": str(ns.path)})
    api = f"http://127.0.0.1:{s.api.port}"
    try:
        st = wait_status(api, lambda x: x["state"] == "ready", 40, proc)
        pid = st["pid"]
        new = s.model_copy(
            update={
                "fallback": (*s.fallback, s.ladder[0].model_copy(update={"name": "added-rung"})),
                "watchdog": s.watchdog.model_copy(update={"health_failures": 7}),
            }
        )
        cfg.write_text(to_toml(new))
        proc.send_signal(signal.SIGHUP)
        st = wait_status(api, lambda x: "added-rung" in x["ladder"], 10, proc)
        assert st["pid"] == pid and st["state"] == "ready"
        cfg.write_text(to_toml(s).replace("[watchdog]", "[watchdog]\nno_such_key = 1"))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        events: list[dict] = []  # type: ignore[type-arg]
        while time.monotonic() < deadline:
            lines = (Path(s.paths.state_dir) / "events.jsonl").read_text().splitlines()
            events = [json.loads(x) for x in lines]
            if any(e["event"] == "config_reload_refused" for e in events):
                break
            time.sleep(0.1)
        refused = [e for e in events if e["event"] == "config_reload_refused"]
        assert refused and "no_such_key" in refused[0]["error"]
        st = wait_status(api, lambda x: True, 5)
        assert st["pid"] == pid and st["state"] == "ready" and "added-rung" in st["ladder"]
        msgs = ns.texts()
        assert msgs.count("READY=1") >= 3 and sum(m.startswith("RELOADING=1") for m in msgs) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(30) == 0
        finally:
            cleanup(proc, s.paths.state_dir)
            ns.close()


async def test_watchdog_pings_stop_when_the_loop_stalls(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ns = NotifySocket(tmp_path / "notify.sock")
    r = await daemon(sim("ok"), env={**os.environ, "NOTIFY_SOCKET": str(ns.path), "WATCHDOG_USEC": "400000"})
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    real_tick = r.owner.tick
    stall: list[float] = []

    async def stuck_tick() -> None:
        stall.append(time.monotonic())
        time.sleep(2.0)  # a blocking call on the loop: the daemon is stuck
        stall.append(time.monotonic())
        r.owner.tick = real_tick  # type: ignore[method-assign]
        await real_tick()

    r.owner.tick = stuck_tick  # type: ignore[method-assign]
    await asyncio.sleep(4.0)
    assert len(stall) == 2
    pings = [t for t, m in ns.drain() if m == "WATCHDOG=1"]
    during = [t for t in pings if stall[0] + 0.01 < t < stall[1] - 0.01]
    after = [t for t in pings if t > stall[1]]
    assert during == [], "a ping went out while the loop was stuck"
    assert len(after) >= 2 and max(b - a for a, b in itertools.pairwise(after)) <= 0.8, "pings resumed"
    assert any(t < stall[0] for t in pings), "pings before the stall"
    ns.close()


def test_log_flood_is_drained_with_bounded_daemon_memory(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("log_flood", tp=1, env={"SGLANG_SIM_FLOOD_MB": "210"})
    s = s.model_copy(update={"logs": s.logs.model_copy(update={"max_file_mb": 20.0, "backups": 2})})
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    proc = start(cfg, dict(os.environ))
    api = f"http://127.0.0.1:{s.api.port}"
    peak = 0
    try:
        server_pid = wait_status(api, lambda x: x["state"] == "ready", 60, proc)["pid"]
        logs = Path(s.paths.state_dir) / "logs"
        deadline = time.monotonic() + 120
        flooded = 0
        while time.monotonic() < deadline:
            peak = max(peak, psutil.Process(proc.pid).memory_info().rss)
            st = httpx.get(f"{api}/status", timeout=5).json()
            assert st["state"] == "ready", st
            # bytes the server's processes wrote, nearly all of it into the daemon's pipes
            flooded = sum(psutil.Process(p["pid"]).io_counters().write_chars for p in st["processes"])
            if flooded >= 210 * 2**20:
                break
            time.sleep(0.2)
        assert flooded >= 210 * 2**20, f"the flood did not get through: {flooded / 2**20:.0f} MiB"
        time.sleep(1.0)
        peak = max(peak, psutil.Process(proc.pid).memory_info().rss)
        written = sum(f.stat().st_size for f in logs.glob("server.log*"))
        assert server_pid == httpx.get(f"{api}/status", timeout=5).json()["pid"]
        assert peak < 150 * 2**20, f"daemon RSS peaked at {peak / 2**20:.0f} MiB"
        assert written <= 3 * 20 * 2**20 + 2**20, "files stay under their cap"
        # the flood did not block the server: it still answers.
        assert httpx.get(f"http://127.0.0.1:{s.server.port}/health", timeout=10).status_code == 200
    finally:
        cleanup(proc, s.paths.state_dir)
