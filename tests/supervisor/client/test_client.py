"""The CLI client against a real uvicorn serving the app over a fake supervisor, on a random port."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest
import uvicorn
from fake_supervisor import FakeSupervisor, attach, sample_starting_snapshot
from prometheus_client import CollectorRegistry

from api.app import create_app
from supervisor.client.verbs import add_client_commands, run_client
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.status.journal import Journal

TOKEN = "client-test-token-42"


@dataclass
class Daemon:
    url: str
    handle: FakeSupervisor
    token_file: Path


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    handle = FakeSupervisor()
    registry = CollectorRegistry()
    SupervisorMetrics(registry, handle.snapshot)
    app = attach(
        create_app(
            None,
            token=TOKEN,
            diag_dir=tmp_path / "diagnostics",
            journal=Journal(tmp_path / "events.jsonl"),
            registry=registry,
            max_body_bytes=64 * 1024,
        ),
        handle,
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # proto 6: asyncio sets TCP_NODELAY
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    try:
        yield Daemon(f"http://127.0.0.1:{port}", handle, token_file)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sglang-supervisor")
    add_client_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def run(argv: list[str], env: dict[str, str] | None = None) -> int:
    return run_client(parse(argv), env=env or {})


def test_status_table(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["status", "--url", daemon.url, "--token-file", str(daemon.token_file)]) == 0
    out = capsys.readouterr().out
    rows = {line[:15].strip(): line[15:] for line in out.splitlines()}
    assert rows["state"].startswith("ready")
    assert rows["rung"].startswith("base (#0 of 3")
    assert rows["pid"] == "4242"
    assert rows["restarts"] == "2 since the daemon started; 1 in the last hour (the budget's window)"
    assert rows["last progress"] == "1.5 s ago"
    # one format for a moment: ISO 8601 with its offset, in this host's zone (issue 53)
    local = datetime(2025, 1, 1, tzinfo=timezone.utc).astimezone().isoformat(timespec="seconds")
    assert rows["last incident"].startswith(f"startup_stall / idle_deadlock at {local} on base")
    assert "health ok 12 ms" in rows["serving"] and "spec accept 3.10" in rows["serving"]
    assert "NVIDIA H200" in rows["GPUs"] and "95% util" in rows["GPUs"]
    for key in ("phase", "progress"):
        assert key in rows


def test_status_while_starting_shows_progress(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.handle.snap = sample_starting_snapshot()
    assert run(["status", "--url", daemon.url], env={"SGLANG_SUPERVISOR_TOKEN": TOKEN}) == 6  # starting
    out = capsys.readouterr().out
    assert "loading_weights" in out
    assert "45/61 it Loading safetensors (73.8%)" in out


def test_status_json_is_the_snapshot(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["status", "--url", daemon.url, "--json"], env={"SGLANG_SUPERVISOR_TOKEN": TOKEN}) == 0
    assert json.loads(capsys.readouterr().out) == daemon.handle.snap.model_dump(mode="json")


def test_restart_then_conflict_exit_1(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["restart", "--url", daemon.url, "--token-file", str(daemon.token_file)]
    assert run([*argv, "--rung", "no-spec", "--reason", "operator test", "--diagnose"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == "restart accepted: incident inc-manual-1; follow it with `status --watch`, or pass --wait"
    cmd = daemon.handle.submitted[-1]
    assert (cmd.rung, cmd.reason, cmd.diagnose) == ("no-spec", "operator test", True)
    assert run(argv) == 1
    err = capsys.readouterr().err
    assert "409" in err and "already under way" in err and "[state: restarting]" in err


def test_unknown_rung_exit_1_lists_rungs(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["restart", "--url", daemon.url, "--rung", "nope", "--json"], {"SGLANG_SUPERVISOR_TOKEN": TOKEN}) == 1
    body = json.loads(capsys.readouterr().out)
    assert body["error"] == "unknown_rung"
    assert run(["restart", "--url", daemon.url, "--rung", "nope"], {"SGLANG_SUPERVISOR_TOKEN": TOKEN}) == 1
    err = capsys.readouterr().err
    assert err.count("base, no-cuda-graph, no-spec") == 1, err  # the ladder is named once, not twice


def test_stop_start_diagnose(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    env = {"SGLANG_SUPERVISOR_TOKEN": TOKEN}
    assert run(["stop", "--url", daemon.url], env) == 0
    # The answer's state is the one before the command: the client does not print it as the result.
    assert capsys.readouterr().out.strip() == "stop accepted (stopping); --wait waits for it"
    assert run(["stop", "--url", daemon.url], env) == 0  # already stopped is done, as the daemon answers
    assert capsys.readouterr().out.strip() == "stop accepted (already stopped)"
    assert run(["start", "--url", daemon.url], env) == 0
    assert capsys.readouterr().out.strip() == "start accepted (starting); --wait waits for it"
    assert run(["diagnose", "--url", daemon.url, "--gdb", "--no-native"], env) == 0
    out = capsys.readouterr().out
    assert "bundle b-manual" in out and "not hung (state" in out and "hang_class" not in out
    cmd = daemon.handle.submitted[-1]
    assert (cmd.kind, cmd.native, cmd.gdb) == ("diagnose", False, True)
    assert run(["diagnose", "--url", daemon.url], env) == 0
    assert (daemon.handle.submitted[-1].native, daemon.handle.submitted[-1].gdb) == (None, None)


def test_diagnose_busy_exit_1(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.handle.diagnosing = True
    assert run(["diagnose", "--url", daemon.url], {"SGLANG_SUPERVISOR_TOKEN": TOKEN}) == 1
    assert "429" in capsys.readouterr().err


def test_missing_or_wrong_token_exit_4(daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["status", "--url", daemon.url]) == 4
    assert "SGLANG_SUPERVISOR_TOKEN" in capsys.readouterr().err
    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    wrong.chmod(0o600)
    assert run(["restart", "--url", daemon.url, "--token-file", str(wrong)]) == 4
    assert run(["status", "--url", daemon.url, "--json"], {"SGLANG_SUPERVISOR_TOKEN": "x"}) == 4
    assert json.loads(capsys.readouterr().out)["error"] == "unauthorized"
    assert daemon.handle.submitted == []


def test_unreachable_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        assert run(["status", "--url", f"http://127.0.0.1:{port}", "--timeout", "2"]) == 3
    assert "cannot reach the daemon" in capsys.readouterr().err


def test_timeout_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)  # accepts into the backlog but never answers
        port = s.getsockname()[1]
        t0 = time.monotonic()
        assert run(["status", "--url", f"http://127.0.0.1:{port}", "--timeout", "0.3"]) == 3
        assert time.monotonic() - t0 < 5
    assert "no answer in time" in capsys.readouterr().err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["status", "--token-file", str(tmp_path / "absent")]) == 2
    assert "--token-file" in (err := capsys.readouterr().err) and "cannot read it" in err
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    assert run(["status", "--token-file", str(empty)]) == 2
    # The daemon's rules for a token file hold for the client too: group or world bits are refused.
    shared = tmp_path / "shared"
    shared.write_text("t0ken\n")
    shared.chmod(0o640)
    capsys.readouterr()
    assert run(["status", "--url", "http://127.0.0.1:1", "--token-file", str(shared)]) == 2
    assert "readable or writable by group or others (mode 0640)" in capsys.readouterr().err
    assert run(["status", "--url", "ftp://127.0.0.1:1"]) == 2
    with pytest.raises(SystemExit) as exc:
        parse(["restart", "--bogus"])
    assert exc.value.code == 2


def test_not_a_supervisor_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """Something else on the port answering HTML is an error, not a crash."""
    body = b"<html>hello</html>"

    async def serve() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        code = await asyncio.to_thread(run, ["status", "--url", f"http://127.0.0.1:{port}"])
        server.close()
        await server.wait_closed()
        assert code == 1

    asyncio.run(serve())
    assert "not a sglang-supervisor answer" in capsys.readouterr().err


def test_raw_traversal_over_a_real_socket_is_404(daemon: Daemon) -> None:
    """What httpx would normalise away, sent byte for byte to uvicorn."""
    host, port = daemon.url.removeprefix("http://").split(":")
    for target in (
        "/diagnostics/../../etc/passwd",
        "/diagnostics/x/..%2F..%2F..%2Fetc%2Fpasswd",
        "/diagnostics/%2e%2e/%2e%2e/etc/passwd",
        "/diagnostics/x/%00",
    ):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            head = f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
            s.sendall(head.encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        status = data.split(b"\r\n", 1)[0]
        assert status.split()[1] in (b"404", b"400"), (target, status)
        assert b"root:" not in data


def test_address_and_token_from_the_daemons_config(
    daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = daemon.url.rsplit(":", 1)[1]
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[api]\nhost = "0.0.0.0"\nport = {port}\ntoken_file = "{daemon.token_file}"\n')
    assert run(["status", "--config", str(cfg)]) == 0
    assert capsys.readouterr().out.startswith("state")
    # An explicit flag wins over the config.
    assert run(["status", "--config", str(cfg), "--url", "http://127.0.0.1:1"]) == 3
    capsys.readouterr()
    os.chmod(daemon.token_file, 0o644)  # what the daemon refuses, the client refuses too
    assert run(["status", "--config", str(cfg)]) == 2
    assert "chmod 600" in capsys.readouterr().err
    assert run(["status", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "--config" in capsys.readouterr().err


def test_events_filtered(daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = Journal(tmp_path / "events.jsonl")
    journal.append("server_ready", rung="base", time_to_ready_s=61.0)
    journal.append("incident", id="20250101T000000Z-startup_stall", cause="startup_stall", detail="no progress")
    journal.append("server_ready", rung="no-cuda-graph", time_to_ready_s=70.0)
    env = {"SGLANG_SUPERVISOR_TOKEN": TOKEN}
    assert run(["events", "--url", daemon.url, "--event", "server_ready"], env) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all("server_ready" in x for x in lines)
    assert "rung=no-cuda-graph" in lines[1] and "time_to_ready_s=70.0" in lines[1]
    assert run(["events", "--url", daemon.url, "--limit", "1"], env) == 0
    assert capsys.readouterr().out.count("\n") == 1
    assert run(["events", "--url", daemon.url, "--since", "2999-01-01T00:00:00Z"], env) == 0
    assert capsys.readouterr().out.strip() == "no events"
    assert run(["events", "--url", daemon.url, "--since", "last tuesday"], env) == 2
    assert "since" in capsys.readouterr().err


def test_bundles_list_and_show(daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = tmp_path / "diagnostics" / "20250101T000000Z-startup_stall"
    bundle.mkdir(parents=True)
    summary = {"id": bundle.name, "trigger": "hung", "cause": "startup_stall", "hang_class": "idle_deadlock"}
    (bundle / "summary.json").write_text(json.dumps({**summary, "rung": "base"}))
    (bundle / "summary.txt").write_text("idle_deadlock: every thread waits\nscheduler TP0 pid 1: waits in acquire\n")
    env = {"SGLANG_SUPERVISOR_TOKEN": TOKEN}
    assert run(["bundles", "--url", daemon.url], env) == 0
    assert capsys.readouterr().out.strip() == f"{bundle.name}  startup_stall  idle_deadlock  rung base"
    assert run(["bundles", "--url", daemon.url, bundle.name], env) == 0
    out = capsys.readouterr().out
    assert "hang_class: idle_deadlock" in out and "scheduler TP0 pid 1: waits in acquire" in out
    assert "files: summary.json, summary.txt" in out
    assert run(["bundles", "--url", daemon.url, "no-such-bundle"], env) == 1
    assert "404" in capsys.readouterr().err


def test_reload(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["reload", "--url", daemon.url], {"SGLANG_SUPERVISOR_TOKEN": TOKEN}) == 0
    assert capsys.readouterr().out.strip() == "reload: reloaded (state ready)"
    assert daemon.handle.submitted[-1].kind == "reload"


@pytest.mark.parametrize(
    ("state", "code"),
    [("ready", 0), ("degraded", 5), ("starting", 6), ("hung", 7), ("diagnosing", 7), ("restarting", 7),
     ("stopped", 8), ("failed", 9)],
)  # fmt: skip
def test_status_exit_code_by_state(daemon: Daemon, state: str, code: int, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.handle.snap = daemon.handle.snap.model_copy(update={"state": state})
    env = {"SGLANG_SUPERVISOR_TOKEN": TOKEN}
    assert run(["status", "--url", daemon.url], env) == code
    assert run(["status", "--url", daemon.url, "--json"], env) == code  # the same code for a script
    capsys.readouterr()


def test_status_shows_the_why_and_marks_frozen_figures(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    from supervisor.status.snapshot import StopView, ToolCheck, WriteErrorsView

    s = daemon.handle.snap
    daemon.handle.snap = s.model_copy(
        update={
            "last_progress_s": None,
            "last_incident": s.last_incident.model_copy(update={"detail": "22 running, no decode tokens for 12 s"})
            if s.last_incident
            else None,
            "selfcheck": (
                ToolCheck(name="py-spy", ok=False, detail="not found on PATH"),
                ToolCheck(name="gdb", ok=True),
                ToolCheck(name="cuda-gdb", ok=False, detail="not found (optional: also names a stuck GPU kernel)"),
                ToolCheck(name="gpm", ok=False, detail="GPU 0: not supported", kind="capability", instead="power"),
            ),
            "write_errors": WriteErrorsView(journal=3),
            "loop_errors": 2,
            "serving": s.serving.model_copy(update={"stale": True, "tokens_moved_s": 12.0, "token_rate": None}),
            "last_stop": StopView(at="2026-12-01T00:00:00+00:00", gpu_released="held"),
        }
    )
    assert run(["status", "--url", daemon.url], {"SGLANG_SUPERVISOR_TOKEN": TOKEN}) == 0
    out = capsys.readouterr().out
    rows = {line[:15].strip(): line[15:] for line in out.splitlines()}
    assert "why: 22 running, no decode tokens for 12 s" in out
    assert rows["self-check"] == "FAILED py-spy: not found on PATH (bundles will lack these stacks)"
    assert rows["optional"] == "cuda-gdb not installed"  # not a failure off a GPU host
    # what an A100 or MIG host cannot do is no failure, and says what stands in for it (issue 38)
    assert rows["unavailable"] == "gpm not available here: GPU 0: not supported; the daemon uses power instead"
    assert rows["write errors"].startswith("journal 3") and rows["loop errors"].startswith("2 caught")
    assert "STALLED: no token for 12.0 s" in rows["serving"] and "tok/s" not in rows["serving"]
    assert rows["last stop"].startswith("at 2026-12-01T00:00:00+00:00: GPU held")
    assert "last progress" not in rows


def test_a_typo_in_the_rest_of_the_config_does_not_stop_the_client(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = daemon.url.rsplit(":", 1)[1]
    cfg = tmp_path / "installed.toml"
    cfg.write_text(f'[watchdog]\nno_such_key = 1\n[api]\nport = {port}\ntoken_file = "{daemon.token_file}"\n')
    monkeypatch.setattr("supervisor.client.locate.DEFAULT_CONFIG", cfg)
    # No --config, no variable: the installed path is used, as on a host set up by systemd/README.md.
    assert run(["status"]) == 0
    assert run(["status", "--config", str(cfg)]) == 0
    assert run(["status"], {"SGLANG_SUPERVISOR_CONFIG": str(cfg)}) == 0
    capsys.readouterr()


def _into_a_closed_pipe(argv: list[str]) -> tuple[int, str]:
    """Run the real command with stdout on a pipe whose reader reads a little and goes away, as
    `| head -c 100` does; its exit status and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        assert proc.stdout.read(100)
        proc.stdout.close()
        err = proc.stderr.read().decode()
    return proc.wait(30), err


@pytest.mark.integration  # runs the CLI twice
def test_a_reader_that_goes_away_ends_the_command_quietly(daemon: Daemon, tmp_path: Path) -> None:
    journal = Journal(tmp_path / "events.jsonl")
    for i in range(1000):  # 1000 events of about 700 bytes: far more than a pipe's 64 KiB buffer
        journal.append("command", kind="restart", reason=f"{i} " + "x" * 600, source="api")
    code, err = _into_a_closed_pipe(
        ["events", "--url", daemon.url, "--token-file", str(daemon.token_file), "--limit", "1000"]
    )
    assert code == 141 and "Traceback" not in err and "BrokenPipe" not in err, (code, err)
    code, err = _into_a_closed_pipe(["completion", "bash"])  # a verb that needs no daemon
    assert code in (0, 141) and "Traceback" not in err, (code, err)


def test_bundles_get_downloads_a_bundle_or_one_file(
    daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "diagnostics" / "20250101T000000Z-startup_stall"
    bundle.mkdir(parents=True)
    (bundle / "summary.json").write_text(json.dumps({"id": bundle.name, "cause": "startup_stall"}))
    (bundle / "summary.txt").write_text("idle_deadlock: every thread waits\n")
    (bundle / "pyspy-4242.txt").write_text("Thread 0x1 (idle)\n  acquire (threading.py:1)\n")
    env = {"SGLANG_SUPERVISOR_TOKEN": TOKEN}
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert run(["bundles", "--url", daemon.url, "get", bundle.name], env) == 0
    got = sorted(p.name for p in (here / bundle.name).iterdir())
    assert got == ["pyspy-4242.txt", "summary.json", "summary.txt"]
    assert (here / bundle.name / "pyspy-4242.txt").read_text() == (bundle / "pyspy-4242.txt").read_text()
    capsys.readouterr()
    assert run(["bundles", "--url", daemon.url, "get", bundle.name], env) == 1  # never overwrites
    assert "exists; not overwritten" in capsys.readouterr().err
    assert run(["bundles", "--url", daemon.url, "get", bundle.name, "summary.txt", "-o", "s.txt"], env) == 0
    assert (here / "s.txt").read_text() == "idle_deadlock: every thread waits\n"
    assert run(["bundles", "--url", daemon.url, "get", bundle.name, "nope.txt"], env) == 1
    assert "has no file 'nope.txt'; it has: " in capsys.readouterr().err
    assert run(["bundles", "--url", daemon.url, "get"], env) == 2
    assert run(["bundles", "--url", daemon.url, "get", "no-such-bundle"], env) == 1
