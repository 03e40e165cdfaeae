"""What `status` says after a daemon restart, with real daemon processes, signals and the simulator:
the last incident is kept (state.json), an adopted server's phase is `serving`, and the takeover is
a figure of its own, not the server's time to ready. And the daemon's log under systemd carries
syslog priorities, so `journalctl -p warning` filters."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from daemonproc import cleanup, wait_status

from supervisor.config.render import dump_toml

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "supervisor"]


def start(cfg: Path, env: dict[str, str], stderr: object = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*CLI, "run", "--config", str(cfg)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,  # type: ignore[arg-type]
    )


def metric(api: str, name: str) -> float | None:
    text = httpx.get(f"{api}/metrics", timeout=5).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_a_restarted_daemon_keeps_the_last_incident_and_tells_takeover_from_load(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    proc = start(cfg, env)
    try:
        first = wait_status(api, lambda x: x["state"] == "ready", 40, proc)
        assert httpx.post(f"{api}/restart", json={"reason": "operator check"}, timeout=10).status_code == 202
        st = wait_status(api, lambda x: x["state"] == "ready" and x["pid"] != first["pid"], 60, proc)
        incident, pid, ttr = st["last_incident"], st["pid"], st["time_to_ready_s"]
        assert incident["cause"] == "manual" and incident["detail"] == "operator check" and ttr > 0
        assert st["phase"] == "serving" and st["adopted"] is False and st["takeover_s"] is None

        proc.kill()  # a crash: the successor adopts the server
        proc.wait(10)
        proc = start(cfg, env)
        st = wait_status(api, lambda x: x["state"] == "ready", 30, proc)
        assert st["pid"] == pid and st["restarts"] == 0
        assert st["last_incident"] == incident  # from state.json: the why survives the daemon
        assert st["phase"] == "serving"  # no ready line in what the successor read: still serving
        assert st["adopted"] is True and st["takeover_s"] is not None and st["takeover_s"] < 15
        assert st["time_to_ready_s"] == ttr  # the server's own load time, as its launcher saw it
        # The takeover is not a load: the load histogram is untouched, the takeover has its own.
        assert metric(api, "sglang_supervisor_adoption_takeover_seconds_count") == 1.0
        assert metric(api, "sglang_supervisor_time_to_ready_seconds_count") == 0.0
        assert metric(api, "sglang_supervisor_last_time_to_ready_seconds") == ttr

        out = subprocess.run([*CLI, "status", "--url", api], capture_output=True, text=True, timeout=30, env=env).stdout
        rows = {line[:15].strip(): line[15:] for line in out.splitlines()}
        assert rows["phase"] == "serving" and "adopted" in rows["pid"]
        assert rows["taken over"].startswith("ready ") and "no reload" in rows["taken over"]
        assert rows["ready in"].endswith("from launch") and rows["last incident"].startswith("manual at ")
        assert "why: operator check" in out and "last progress" not in rows  # not a figure for a serving server
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        finally:
            cleanup(proc, str(s.paths.state_dir))


def test_under_systemd_the_daemons_lines_carry_syslog_priorities(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    stream = open(tmp_path / "journal-stream", "w+b")  # noqa: SIM115 - stands in for journald's socket
    st = os.fstat(stream.fileno())
    env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    proc = start(cfg, env, stderr=stream)
    try:
        first = wait_status(api, lambda x: x["state"] == "ready", 40, proc)
        assert httpx.post(f"{api}/restart", json={"reason": "prio"}, timeout=10).status_code == 202
        wait_status(api, lambda x: x["state"] == "ready" and x["pid"] != first["pid"], 60, proc)
        proc.terminate()
        assert proc.wait(30) == 0
    finally:
        cleanup(proc, str(s.paths.state_dir))
        stream.close()
    lines = (tmp_path / "journal-stream").read_text().splitlines()
    assert lines and all(re.match(r"<[2-7]>", x) for x in lines), [x for x in lines if not re.match(r"<\d>", x)][:5]
    assert any(x.startswith("<6>") and "server_ready" not in x and "state_changed" in x for x in lines)
    warnings = [x for x in lines if x[:3] in ("<4>", "<3>", "<2>")]
    assert any("incident" in x and "cause=manual" in x for x in warnings)  # journalctl -p warning shows it
    assert not any(x.lstrip("<0123456789>").startswith("{") for x in lines)  # console format, not JSON
