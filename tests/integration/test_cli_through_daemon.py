"""Issue 38's CLI bullets with both ends real: a `sglang-supervisor run` daemon process (a token
configured, a journal that already holds hours of history) and `sglang-supervisor` clients started
as a shell starts them: `events --since 1h`, a reader that closes the pipe early (`| head -n1`),
and a world-readable `--token-file`, refused by the client in the daemon's own words."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemonproc import cleanup, start
from simconfig import sim_settings

from supervisor.common.waiting import wait_for
from supervisor.config.render import dump_toml
from supervisor.config.settings import Settings

pytestmark = pytest.mark.integration

TOKEN = "cli-through-daemon-0123456789abcdef"
OLD_EVENTS = 300  # about 700 bytes each: `events --limit 1000` answers far more than a pipe's 64 KiB
CLIENT_TIMEOUT_S = 60.0
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell shows for `yes | head -n1`


def client_argv() -> list[str]:
    """The console script a user types, installed beside this interpreter; `-m supervisor` if not."""
    script = Path(sys.executable).with_name("sglang-supervisor")
    return [str(script)] if script.exists() else [sys.executable, "-m", "supervisor"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("SGLANG_SUPERVISOR_TOKEN", "SGLANG_SUPERVISOR_CONFIG")}


def _ts(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _restart(reason: str, i: int, at: datetime) -> dict[str, Any]:
    return {"ts": _ts(at), "event": "command", "kind": "restart", "reason": f"{reason} #{i}", "source": "api"}


def _history(state_dir: Path, now: datetime) -> None:
    """The journal of an earlier run of this daemon: restarts three hours ago, two fifty minutes ago."""
    state_dir.mkdir(parents=True, mode=0o750)
    pad = " " + "x" * 600
    old = [
        _restart("three hours ago" + pad, i, now - timedelta(hours=3, seconds=OLD_EVENTS - i))
        for i in range(OLD_EVENTS)
    ]
    recent = [_restart("fifty minutes ago", i, now - timedelta(minutes=50, seconds=2 - i)) for i in range(2)]
    (state_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in old + recent))


@dataclass
class Daemon:
    settings: Settings
    api: str
    token_file: Path
    proc: subprocess.Popen[bytes]

    def argv(self, verb: str, *rest: str, token_file: Path | None = None) -> list[str]:
        return [*client_argv(), verb, "--url", self.api, "--token-file", str(token_file or self.token_file), *rest]

    def cli(self, verb: str, *rest: str, token_file: Path | None = None) -> subprocess.CompletedProcess[str]:
        argv = self.argv(verb, *rest, token_file=token_file)
        return subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=CLIENT_TIMEOUT_S)

    def status(self) -> dict[str, Any] | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the daemon exited {self.proc.returncode}")
        try:
            answer = httpx.get(f"{self.api}/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
            return answer.json()  # type: ignore[no-any-return]
        except (httpx.HTTPError, ValueError):
            return None

    def ready(self, timeout: float = 90) -> dict[str, Any]:
        return wait_for(self.status, lambda x: x.get("state") == "ready", timeout, what="ready", interval=0.2)

    def restart(self, reason: str) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        answer = httpx.post(f"{self.api}/restart", json={"reason": reason}, headers=headers, timeout=15)
        assert answer.status_code == 202, answer.text


@pytest.fixture(scope="module")
def daemon_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module (its start is most of each test's time); each test waits for `ready`."""
    tmp = tmp_path_factory.mktemp("cli-daemon")
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    s = sim_settings(tmp, "ok", api={"token_file": str(token_file)})
    _history(Path(s.paths.state_dir), datetime.now(timezone.utc))
    cfg = tmp / "config.toml"
    cfg.write_text(dump_toml(s))
    proc = start(cfg, _env())
    try:
        yield Daemon(s, f"http://127.0.0.1:{s.api.port}", token_file, proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        cleanup(proc, s.paths.state_dir)


def _at(line: str) -> datetime:
    return datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))


def test_events_since_a_relative_time_answers_the_last_hour(daemon_proc: Daemon) -> None:
    d = daemon_proc
    d.ready()
    asked_at = datetime.now(timezone.utc)
    r = d.cli("events", "--since", "1h")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "fifty minutes ago #0" in r.stdout and "fifty minutes ago #1" in r.stdout, r.stdout[:2000]
    assert any(" daemon_started " in x for x in lines) and any("new=ready" in x for x in lines), r.stdout[:2000]
    assert "three hours ago" not in r.stdout
    # Every line is of the last hour (the client's "now" is a moment after the test's).
    assert all(_at(x) >= asked_at - timedelta(hours=1, seconds=1) for x in lines), lines[:3]
    # The old ones are there to be shown: the span, not the journal, left them out.
    everything = d.cli("events", "--limit", "1000")
    assert everything.returncode == 0 and everything.stdout.count("three hours ago") == OLD_EVENTS


class Pipeline:
    """`CLIENT ... | head -n1` run by bash, the client's stderr and exit status kept apart."""

    def __init__(self, argv: list[str], err: Path) -> None:
        script = f'{shlex.join(argv)} 2>{shlex.quote(str(err))} | head -n1; echo "client exit ${{PIPESTATUS[0]}}"'
        self.err = err
        self.proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True, env=_env())
        self._reader = ThreadPoolExecutor(1)

    def first_line(self, timeout: float) -> str:
        """What head printed: once it is here, head has its line and is exiting."""
        assert self.proc.stdout is not None
        return self._reader.submit(self.proc.stdout.readline).result(timeout)

    def finish(self, timeout: float) -> tuple[int, str]:
        """The client's exit status and everything it wrote on stderr."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        finally:
            self.close()
        last = out.strip().splitlines()[-1] if out.strip() else ""
        assert last.startswith("client exit "), out
        return int(last.removeprefix("client exit ")), self.err.read_text()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.shutdown(wait=False, cancel_futures=True)


def test_a_reader_that_closes_the_pipe_early_ends_the_client_quietly(daemon_proc: Daemon, tmp_path: Path) -> None:
    d = daemon_proc
    d.ready()
    # An answer larger than the pipe holds: the client is still writing when head goes.
    p = Pipeline(d.argv("events", "--limit", "1000"), tmp_path / "events.err")
    assert p.first_line(CLIENT_TIMEOUT_S).strip()
    assert p.finish(CLIENT_TIMEOUT_S) == (EXIT_BROKEN_PIPE, "")

    # A follow: the server's next access line (every poll, shown with --all) meets the closed pipe.
    p = Pipeline(d.argv("logs", "-f", "--all", "-n", "5"), tmp_path / "logs.err")
    assert p.first_line(CLIENT_TIMEOUT_S).strip()
    assert p.finish(CLIENT_TIMEOUT_S) == (EXIT_BROKEN_PIPE, "")

    # An events follow writes only when something happens: a restart makes it happen.
    p = Pipeline(d.argv("events", "--follow", "--limit", "3"), tmp_path / "follow.err")
    try:
        assert p.first_line(CLIENT_TIMEOUT_S).strip()
        d.restart("the follow's reader has gone")
        assert p.finish(CLIENT_TIMEOUT_S) == (EXIT_BROKEN_PIPE, "")
    finally:
        p.close()
    d.ready()


def test_a_world_readable_token_file_is_refused_by_the_client_as_by_the_daemon(
    daemon_proc: Daemon, tmp_path: Path
) -> None:
    d = daemon_proc
    d.ready()
    loose = tmp_path / "token"
    loose.write_text(TOKEN + "\n")
    loose.chmod(0o644)
    rule = f"readable or writable by group or others (mode 0644); make it private with `chmod 600 {loose}`"

    r = d.cli("status", token_file=loose)
    assert (r.returncode, r.stdout) == (2, ""), r
    assert f"--token-file {loose}: {rule}" in r.stderr and TOKEN not in r.stderr and "Traceback" not in r.stderr

    # The daemon, given the same file, refuses to start with the same words (and launches nothing).
    s = sim_settings(tmp_path, "ok", api={"token_file": str(loose)})
    cfg = tmp_path / "config.toml"
    cfg.write_text(dump_toml(s))
    run = subprocess.run(
        [*client_argv(), "run", "--config", str(cfg)], capture_output=True, text=True, env=_env(), timeout=60
    )
    assert run.returncode == 2 and f"[api] token_file {str(loose)!r}: {rule}" in run.stderr, run.stderr[-2000:]

    loose.chmod(0o600)  # what the message says to do
    r = d.cli("status", token_file=loose)
    assert r.returncode == 0 and r.stdout.startswith("state"), r
