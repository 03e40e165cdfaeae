"""The CLI as an operator runs it on the host: `sglang-supervisor ... --config FILE` against a real
`sglang-supervisor run` process with a token, reloading its config through the API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.config.render import dump_toml

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "supervisor"]


def cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60, env=env)


def test_reload_and_status_with_address_and_token_from_the_config(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    token = tmp_path / "token"
    token.write_text("operator-token-" + "x" * 32 + "\n")
    token.chmod(0o600)
    s = sim("ok", api={"token_file": str(token)})
    cfg = tmp_path / "config.toml"
    cfg.write_text(dump_toml(s))
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_SUPERVISOR_TOKEN"}
    daemon = subprocess.Popen(
        [*CLI, "run", "--config", str(cfg), "--log-json"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 40
        while True:
            st = cli("status", "--config", str(cfg), "--json", env=env)
            if st.returncode == 0 and json.loads(st.stdout)["state"] == "ready":
                break
            assert time.monotonic() < deadline, st.stdout + st.stderr
            assert daemon.poll() is None, "the daemon exited"
            time.sleep(0.3)
        # No token, no --config: refused, and the hint says where a token comes from.
        bare = cli("status", "--url", f"http://127.0.0.1:{s.api.port}", env=env)
        assert bare.returncode == 4 and "--token-file" in bare.stderr

        # A valid change reloads without touching the server.
        pid = json.loads(st.stdout)["pid"]
        cfg.write_text(dump_toml(s).replace("health_failures = 2", "health_failures = 5"))
        ok = cli("reload", "--config", str(cfg), env=env)
        assert ok.returncode == 0 and ok.stdout.strip() == "reload: reloaded (state ready)", ok.stdout + ok.stderr
        # An invalid file is refused with the key named, and the old settings stay.
        cfg.write_text(dump_toml(s).replace("health_failures = 2", "health_failures = 0"))
        bad = cli("reload", "--url", f"http://127.0.0.1:{s.api.port}", "--token-file", str(token), env=env)
        assert bad.returncode == 1 and "watchdog.health_failures" in bad.stderr, bad.stdout + bad.stderr
        cfg.write_text(dump_toml(s))
        after = json.loads(cli("status", "--config", str(cfg), "--json", env=env).stdout)
        assert (after["state"], after["pid"]) == ("ready", pid)
        events = cli(
            "events", "--config", str(cfg), "--event", "config_reloaded", "--event", "config_reload_refused", env=env
        )
        lines = events.stdout.splitlines()
        assert [x.split()[1] for x in lines] == ["config_reloaded", "config_reload_refused"], events.stdout
    finally:
        daemon.terminate()
        assert daemon.wait(60) == 0
