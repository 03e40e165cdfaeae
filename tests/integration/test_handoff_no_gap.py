"""The SIGUSR2 handoff has no gap (issue 50): the API's listening socket and the state directory's
lock cross the re-exec, so a local user looping `bind()` on the port never gets it (nor the bearer
token a client sends), no other daemon takes the state directory in between, and signals sent
while the new image starts wait for its handlers. Real daemons, a real squatting process, real signals.

The attack it answers: a loop binding the API port won the gap 5 s after SIGUSR2; the new image
exited 2, the server ran on with no daemon, and `sglang-supervisor status` sent the squatter the token.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from daemonproc import cleanup, marked, start
from statedir import events, named
from waiting import wait_for

from bench.squatter import Squatter
from supervisor.common.exitcodes import EXIT_LOCKED
from supervisor.config.render import dump_toml as to_toml

pytestmark = pytest.mark.integration

TOKEN = "handoff-no-gap-token-" + "q" * 24
HELD = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGHUP - 1)) | (1 << (signal.SIGUSR2 - 1))

# A second process trying the state directory's lock as fast as it can; SIGTERM: it writes its counts.
LOCK_PROBE = """
import fcntl, json, os, signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
tries = won = 0
while not stop:
    fd = os.open(sys.argv[1], os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        won += 1
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    tries += 1
    time.sleep(0.001)
open(sys.argv[2], "w").write(json.dumps({"tries": tries, "won": won}))
"""


def sig_blocked(pid: int) -> int:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    return next((int(x.split()[1], 16) for x in lines if x.startswith("SigBlk:")), 0)


def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def status(api: str) -> dict[str, Any] | None:
    try:
        r = httpx.get(f"{api}/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=3, trust_env=False)
        return r.json() if r.status_code == 200 else None  # type: ignore[no-any-return]
    except (httpx.HTTPError, ValueError):
        return None


def wait_ready(api: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        assert proc.poll() is None, f"daemon exited {proc.returncode}"
        st = status(api)
        return st if st is not None and st["state"] == "ready" else None

    found: list[dict[str, Any]] = []
    assert wait_for(lambda: found.append(st) or True if (st := ready()) else False, timeout), "never ready"
    return found[-1]


def hand_off(proc: subprocess.Popen[bytes], state_dir: Path) -> None:
    """SIGUSR2, then wait for the new image to adopt the server (the preflight and a Python start on a
    loaded 2-core machine took most of a minute)."""
    adopted = len(named(state_dir, "server_adopted"))
    proc.send_signal(signal.SIGUSR2)
    assert wait_for(lambda: len(named(state_dir, "server_adopted")) > adopted or proc.poll() is not None, 180)
    assert proc.poll() is None, f"daemon exited {proc.returncode} in the handoff"
    assert not named(state_dir, "handoff_refused"), named(state_dir, "handoff_refused")


def listens_on(pid: int, port: int) -> bool:
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        for c in psutil.Process(pid).net_connections(kind="tcp")
    )


class Asker(threading.Thread):
    """A client asking `/status` with the token every 50 ms, as an operator's `status --watch` would."""

    def __init__(self, api: str) -> None:
        super().__init__(daemon=True)
        self.api, self.halt, self.answers, self.misses = api, threading.Event(), 0, 0

    def run(self) -> None:
        while not self.halt.wait(0.05):
            if status(self.api) is not None:
                self.answers += 1
            else:
                self.misses += 1


@pytest.mark.timeout(600)
def test_a_squatter_never_gets_the_port_nor_the_token_and_the_lock_is_never_free(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1, api={"token_file": str(token_file(tmp_path))})
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    state_dir = Path(s.paths.state_dir)
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    squatter: Squatter | None = None
    probe: subprocess.Popen[bytes] | None = None
    second: subprocess.Popen[bytes] | None = None
    asker = Asker(api)
    try:
        server = wait_ready(api, proc)["pid"]
        squatter = Squatter("127.0.0.1", s.api.port, tmp_path / "squat.json", tmp_path / "token")
        probe = subprocess.Popen(
            [sys.executable, "-c", LOCK_PROBE, str(state_dir / "daemon.lock"), str(tmp_path / "probe.json")]
        )
        asker.start()
        time.sleep(1)  # both loops running before the first handoff

        # First handoff, and a second daemon on the same state directory started while it runs.
        commanded = len([e for e in named(state_dir, "command") if e.get("kind") == "handoff"])
        proc.send_signal(signal.SIGUSR2)
        assert wait_for(
            lambda: len([e for e in named(state_dir, "command") if e.get("kind") == "handoff"]) > commanded, 120
        ), "the preflight did not pass"
        second = start(cfg, dict(os.environ))  # the lock is being handed over right now
        assert wait_for(lambda: len(named(state_dir, "server_adopted")) >= 1 or proc.poll() is not None, 180)
        assert proc.poll() is None, f"daemon exited {proc.returncode} in the handoff"
        assert second.wait(120) == EXIT_LOCKED, "a second daemon took the state directory"
        hand_off(proc, state_dir)  # and once more, with the squatter still looping
        after = wait_ready(api, proc, 60)
    finally:
        asker.halt.set()
        got = squatter.stop() if squatter is not None else {}
        if probe is not None:
            probe.send_signal(signal.SIGTERM)
            probe.wait(30)
        if second is not None and second.poll() is None:
            second.kill()
            second.wait(10)
        alive = proc.poll() is None
        listening = alive and listens_on(proc.pid, s.api.port)
        cleanup(proc, str(state_dir))
    assert got.get("tries", 0) > 100, got  # it really looped through both handoffs
    assert got["won"] == 0 and got["connections"] == 0, f"the squatter bound the API port: {got}"
    assert got["got_token"] is False
    probed = json.loads((tmp_path / "probe.json").read_text())
    assert probed["tries"] > 100 and probed["won"] == 0, f"the state directory's lock was free: {probed}"
    assert alive and listening, "the same daemon process listens on the API port after the handoffs"
    assert after["pid"] == server, "the same server, adopted twice"
    assert asker.answers > 0
    inherited = named(state_dir, "handoff_inherited")
    assert len(inherited) == 2 and all(e["listener"] and e["lock"] and not e["ignored"] for e in inherited), inherited
    assert [e["event"] for e in events(state_dir)].count("server_launched") == 1


@pytest.mark.timeout(420)
def test_a_handoff_onto_a_config_that_moves_the_api_is_refused_and_the_old_daemon_serves_on(
    sim, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1, api={"token_file": str(token_file(tmp_path))})
    cfg = tmp_path / "c.toml"
    good = to_toml(s)
    cfg.write_text(good)
    state_dir = Path(s.paths.state_dir)
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    squatter: Squatter | None = None
    try:
        server = wait_ready(api, proc)["pid"]
        squatter = Squatter("127.0.0.1", s.api.port, tmp_path / "squat.json", tmp_path / "token")
        moved = s.api.port + 1 if s.api.port < 65000 else s.api.port - 1
        cfg.write_text(good.replace(f"port = {s.api.port}\n", f"port = {moved}\n", 1))
        assert f"port = {moved}" in cfg.read_text()
        proc.send_signal(signal.SIGUSR2)
        assert wait_for(lambda: named(state_dir, "handoff_refused"), 120), "no handoff_refused"
        refused = named(state_dir, "handoff_refused")[0]
        assert f"{moved}" in refused["reason"] and f"{s.api.port}" in refused["reason"], refused
        assert "restart" in refused["reason"], refused
        st = wait_ready(api, proc, 30)
        assert st["pid"] == server and proc.poll() is None, "the old daemon serves on, its server untouched"
        assert not named(state_dir, "daemon_handoff") and not named(state_dir, "handoff_inherited")
        got = squatter.stop()
        squatter = None
        assert got["won"] == 0 and got["got_token"] is False, got
    finally:
        if squatter is not None:
            squatter.stop()
        cleanup(proc, str(state_dir))


@pytest.mark.timeout(420)
def test_signals_sent_while_the_new_image_starts_wait_for_its_handlers(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """From the old image's teardown to the new image's handlers the mask is held (and survives the
    exec): a burst of SIGHUP every 2 ms through that window kills nothing, and the last one is a
    reload by the new image. Then a SIGTERM in the same window is a clean stop by the new image."""
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    state_dir = Path(s.paths.state_dir)
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    try:
        server = wait_ready_open(api, proc)
        held_s, sent = burst_through_the_handoff(proc, signal.SIGHUP, state_dir)
        print(f"\nhandoff: signals held {held_s * 1000:.0f} ms from teardown to the new handlers; {sent} SIGHUP sent")
        assert proc.poll() is None, f"killed by a signal during the handoff: {proc.returncode}"
        assert sent > 0 and held_s > 0, "the burst never met the handoff's window"
        assert wait_for(lambda: named(state_dir, "handoff_inherited"), 60)
        inherited_at = named(state_dir, "handoff_inherited")[0]["ts"]
        # The SIGHUPs the new image found pending became a reload once its handlers ran.
        assert wait_for(lambda: [e for e in named(state_dir, "config_reloaded") if e["ts"] >= inherited_at], 60)
        st = wait_ready_open(api, proc, 60)
        assert st == server and proc.poll() is None

        # A stop during an upgrade is not lost: the new image stops, the server with it.
        marker = json.loads((state_dir / "state.json").read_text())["marker"]
        held_s, sent = burst_through_the_handoff(proc, signal.SIGTERM, state_dir, once=True)
        assert sent == 1
        assert proc.wait(120) == 0, "not -15: the stop went through the new image's own shutdown"
        assert wait_for(lambda: marked(marker) == [], 30), "the server stopped with it"
        assert named(state_dir, "handoff_inherited")[1:], "the stop came after the second handoff"
    finally:
        cleanup(proc, str(state_dir))


def wait_ready_open(api: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> int:
    """The server's pid once ready (an API without a token)."""

    def ready() -> int | None:
        assert proc.poll() is None, f"daemon exited {proc.returncode}"
        try:
            st = httpx.get(f"{api}/status", timeout=3, trust_env=False).json()
        except (httpx.HTTPError, ValueError):
            return None
        return int(st["pid"]) if st.get("state") == "ready" and st.get("pid") else None

    found: list[int] = []
    assert wait_for(lambda: found.append(p) or True if (p := ready()) else False, timeout), "never ready"
    return found[-1]


def burst_through_the_handoff(
    proc: subprocess.Popen[bytes], sig: signal.Signals, state_dir: Path, once: bool = False
) -> tuple[float, int]:
    """SIGUSR2; then `sig` every 2 ms from the moment the old image journals `daemon_handoff` (its
    teardown begins) until the new image's handlers take the signals (its mask clear again). `once`:
    a single `sig`, sent once the mask is held for the re-exec. (seconds held, signals sent)"""
    journal = state_dir / "events.jsonl"
    before = journal.read_text().count('"daemon_handoff"')
    proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 180  # the preflight first: a Python start on a loaded machine

    def begun() -> bool:
        if once:  # exactly the three: spawning a child (the preflight) blocks every signal for a moment
            return sig_blocked(proc.pid) == HELD
        return journal.read_text().count('"daemon_handoff"') > before

    while not begun():
        assert proc.poll() is None and time.monotonic() < deadline, "the handoff never began"
        time.sleep(0.002)
    t0, held_at, sent = time.monotonic(), None, 0
    while proc.poll() is None and time.monotonic() - t0 < 120:
        mask = sig_blocked(proc.pid)
        if mask == HELD and held_at is None:
            held_at = time.monotonic()
        elif mask & HELD != HELD and held_at is not None:
            break  # the new image's handlers run
        if not once or sent == 0:
            proc.send_signal(sig)
            sent += 1
        time.sleep(0.002)
    return (time.monotonic() - held_at if held_at is not None else 0.0), sent


@pytest.mark.timeout(300)
def test_how_late_a_fresh_start_holds_its_signals(tmp_path: Path) -> None:
    """A fresh `python -m supervisor run`: one SIGUSR2 at a growing delay after the exec. Before the
    first line of Python holds the mask (the interpreter's own start) it kills; from the moment the
    mask shows held it never does (the daemon then exits 2 on its missing config instead)."""
    cfg = tmp_path / "missing.toml"
    killed_at: list[float] = []
    survived_at: list[float] = []
    # Each delay twice; None: as soon as the mask shows held, however long the start takes.
    for delay in (*(0.0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32) * 2, None):
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        t0 = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "run", "--config", str(cfg)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while (
            (time.monotonic() - t0 < delay)
            if delay is not None
            else (sig_blocked(child.pid) & HELD != HELD and child.poll() is None and time.monotonic() - t0 < 60)
        ):
            time.sleep(0.0005)
        was_held = sig_blocked(child.pid) & HELD == HELD
        if delay is None:
            assert was_held, "the entry point never held the signals"
        child.send_signal(signal.SIGUSR2)
        at = time.monotonic() - t0
        code = child.wait(60)
        if code == -signal.SIGUSR2:
            killed_at.append(at)
            assert not was_held, f"killed by SIGUSR2 at {at * 1000:.0f} ms although its mask held it"
        else:
            assert code == 2, code
            survived_at.append(at)
    print(
        f"\nfresh start: killed by SIGUSR2 sent at {[round(x * 1000) for x in sorted(killed_at)]} ms, "
        f"held at {[round(x * 1000) for x in sorted(survived_at)]} ms after the exec"
    )
    assert survived_at, "a SIGUSR2 sent once the mask showed held killed it"
