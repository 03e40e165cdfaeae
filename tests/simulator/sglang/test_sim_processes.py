"""What a supervisor must cope with when stopping the tree: ignored SIGTERM, escapees, floods, orphans."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

import psutil
import pytest

if TYPE_CHECKING:
    from conftest import SimStarter

pytestmark = pytest.mark.integration

READY = "The server is fired up and ready to roll!"


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def listeners(port: int) -> list[int]:
    return [c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port and c.status == "LISTEN"]


def test_children_die_with_main_by_pdeathsig(sim: SimStarter) -> None:
    s = sim("deadlock_after_load", tp=2)
    assert s.wait_log("KV Cache is allocated", count=2)
    kids = s.children()
    assert len(kids) >= 3
    s.proc.kill()  # only the main process: no signal reaches the children
    assert s.proc.wait(5) == -signal.SIGKILL
    assert s.wait_until(lambda: not any(alive(k) for k in kids), 5)


def test_ignore_sigterm_survives_sigterm(sim: SimStarter) -> None:
    s = sim("ignore_sigterm", tp=2)
    assert s.wait_log(READY)
    tree = [psutil.Process(s.proc.pid), *s.children()]
    os.killpg(s.proc.pid, signal.SIGTERM)
    time.sleep(1.5)
    assert all(alive(p) for p in tree)
    assert s.request("/health")[0] == 200
    assert "SIGTERM received" not in s.stderr()
    os.killpg(s.proc.pid, signal.SIGKILL)
    assert s.proc.wait(5) == -signal.SIGKILL
    assert s.onset()["scenario"] == "ignore_sigterm"


def test_escape_group_keeps_the_port_after_main_dies(sim: SimStarter) -> None:
    s = sim("escape_group", tp=1)
    assert s.wait_log(READY)
    main_sid = os.getsid(s.proc.pid)
    escaped = [p for p in s.marked() if os.getsid(p.pid) != main_sid]
    assert len(escaped) == 1, escaped
    helper = escaped[0]
    assert helper.ppid() != s.proc.pid and os.getpgid(helper.pid) != s.proc.pid  # not a child, not in the group
    assert helper.pid in listeners(s.port)  # shares the listening socket
    assert s.onset()["writer_pid"] == helper.pid
    os.killpg(s.proc.pid, signal.SIGKILL)  # the whole group, as a naive stop would
    s.proc.wait(5)
    time.sleep(0.3)
    assert alive(helper) and s.accepts() and listeners(s.port) == [helper.pid]
    helper.send_signal(signal.SIGHUP)  # ignored
    time.sleep(0.2)
    assert alive(helper)


def test_log_flood_writes_everything_and_keeps_serving(sim: SimStarter) -> None:
    s = sim("log_flood", tp=1, env={"SGLANG_SIM_FLOOD_MB": "12"})
    assert s.wait_log(READY)
    assert s.wait_until(lambda: s.err_path.stat().st_size > 12 * 1024 * 1024, 20)
    raw = s.err_path.read_bytes()
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    assert max(len(line) for line in raw.split(b"\n")) >= 1024 * 1024  # one line of a MB
    assert raw.count(b"\r") > 1000  # progress redrawn in place
    assert s.request("/health")[0] == 200 and s.proc.poll() is None
