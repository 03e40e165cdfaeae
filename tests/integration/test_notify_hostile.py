"""Issue 33's notification attacks through the running daemon: a webhook receiver that trickles its
headers (one byte every 1.5 s against timeout_s 2) and an exec hook whose `setsid` child outlived
the hook's timeout."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from notifyhook import with_notify
from statedir import events
from waiting import until

from supervisor.config.alerting import NotifyTarget

pytestmark = pytest.mark.integration

FAIL_FAST = {"retries_per_rung": 0, "failed_cooldown_s": 0, "backoff_initial_s": 0.2}


def notes(state_dir: str | Path) -> list[dict[str, Any]]:
    return [e for e in events(state_dir) if e["event"] == "notification"]


@contextlib.contextmanager
def trickling_receiver(every_s: float = 1.5) -> Iterator[tuple[str, list[int]]]:
    """Reads each request, then answers `HTTP/1.1 200 OK...` one byte every `every_s`."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    accepted: list[int] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                conn.recv(65536)
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                if stop.wait(every_s):
                    return
                try:
                    conn.send(bytes([b]))
                except OSError:
                    return

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(1)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}", accepted
    finally:
        stop.set()
        srv.close()
        t.join(5)


async def test_a_receiver_trickling_its_headers_is_a_journalled_and_counted_failure(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    with trickling_receiver() as (url, accepted):
        s = with_notify(
            sim("crash_on_load", restart=FAIL_FAST),
            NotifyTarget(name="trickle", url=f"{url}/hook", timeout_s=2, retries=1, backoff_initial_s=0.1),
        )
        r = await daemon(s)
        await r.wait_for(lambda x: x.state == "failed", 40, "failed")
        await until(lambda: any(n["notified"] == "failed" for n in notes(s.paths.state_dir)), 30, "the failed delivery")
        note = next(n for n in notes(s.paths.state_dir) if n["notified"] == "failed")
        assert note["outcome"] == "failed" and note["attempts"] == 2, note
        assert "timed out after 2 s (the whole attempt)" in note["error"]
        assert len(accepted) >= 2
        async with httpx.AsyncClient() as c:
            metrics = (await c.get(f"{r.api}/metrics")).text
        assert 'sglang_supervisor_notifications_total{event="failed",outcome="failed",target="trickle"} 1.0' in metrics
        await r.stop()


HOOK = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_a_hooks_setsid_child_dies_with_the_hook_at_its_timeout(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script, pid_file = tmp_path / "hook.py", tmp_path / "child.pid"
    script.write_text(HOOK)
    s = with_notify(
        sim("crash_on_load", restart=FAIL_FAST),
        NotifyTarget(
            name="slow", kind="exec", argv=(sys.executable, str(script), str(pid_file)), timeout_s=1.5, retries=0
        ),
    )
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "failed", 40, "failed")
    await until(lambda: any(n["notified"] == "failed" for n in notes(s.paths.state_dir)), 30, "the failed delivery")
    note = next(n for n in notes(s.paths.state_dir) if n["notified"] == "failed")
    assert note["outcome"] == "failed" and "timed out" in note["error"]
    child = int(pid_file.read_text())
    assert os.getsid(child) == child if alive(child) else True  # it had left the hook's session
    deadline = time.monotonic() + 20
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), "the hook's setsid child outlived the hook's timeout"
    await r.stop()
