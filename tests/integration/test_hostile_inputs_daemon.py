"""Issue 33's smaller items through the running daemon: a 0600 token file owned by another user is
refused when `sglang-supervisor run` starts, and a server's own error text (Slack's `<!channel>`
and a `<URL|label>` link in it) reaches a Slack-format `[[notify]]` target escaped, shown and never
acted on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from notifyhook import with_notify
from receivers import receiver
from statedir import events
from waiting import until

from supervisor.config.alerting import NotifyTarget
from supervisor.config.render import dump_toml

pytestmark = pytest.mark.integration

NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root (as in CI)")
def test_a_token_file_owned_by_another_user_is_refused_at_start(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    token = tmp_path / "token"
    token.write_text("a-token-another-user-can-rewrite-0123\n")
    token.chmod(0o600)
    os.chown(token, NOBODY, NOBODY)  # private by its mode, but nobody's: nobody could swap the token
    s = sim("ok", api={"token_file": str(token)})
    cfg = tmp_path / "config.toml"
    cfg.write_text(dump_toml(s))
    run = subprocess.run(
        [sys.executable, "-m", "supervisor", "run", "--config", str(cfg), "--log-json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
    assert run.returncode == 2, run.stderr[-2000:]
    assert said == (
        f"sglang-supervisor: [api] token_file {str(token)!r}: owned by uid {NOBODY}, not by this process's user "
        f"(uid 0); `chown 0 {token}` if it is yours"
    ), run.stderr[-2000:]
    assert "Traceback" not in run.stderr and "a-token-another-user" not in run.stderr
    started = [e["event"] for e in events(s.paths.state_dir)]
    assert "server_launched" not in started and "daemon_started" not in started, started
    with socket.socket() as probe:  # no API was ever served: the port is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", s.api.port))


# A server that fails the way SGLang does, its exception carrying text Slack would act on.
HOSTILE = "weights missing <!channel> see <http://x|link> & `rm -rf /`"
FAILING_SERVER = f"""
import sys, time
print("Traceback (most recent call last):", file=sys.stderr, flush=True)
print('  File "/srv/loader.py", line 7, in load', file=sys.stderr, flush=True)
print({f"RuntimeError: {HOSTILE}"!r}, file=sys.stderr, flush=True)
time.sleep(2)  # the daemon reads the line before it sees the exit (its poll is 0.5 s)
sys.exit(1)
"""


async def test_slack_gets_a_servers_hostile_error_text_escaped(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "server.py"
    script.write_text(FAILING_SERVER)
    s = sim("ok", tp=1, restart={"retries_per_rung": 3})  # more exits, should one be judged before its line
    s = s.model_copy(
        update={"server": s.server.model_copy(update={"command": (sys.executable, str(script)), "args": {}})}
    )
    with receiver("ok") as (url, got):
        s = with_notify(
            s,
            NotifyTarget(name="slack", format="slack", url=f"{url}/slack"),
            NotifyTarget(name="team-json", url=f"{url}/json"),
        )
        r = await daemon(s)
        try:
            # Each exit is an incident (the ladder relaunches): wait for one whose reason has the line.
            await until(
                lambda: any("channel" in b.get("text", "") for b in got.bodies("/slack")), 60, "the Slack message"
            )
            await until(
                lambda: any(HOSTILE in (b.get("reason") or "") for b in got.bodies("/json")), 30, "the JSON one"
            )
        finally:
            await r.stop()  # before the receiver closes: the daemon's client holds keep-alive connections

    slack = [b for b in got.bodies("/slack") if "channel" in b.get("text", "")]
    text = slack[0]["text"]
    assert text.startswith(":warning: ") and "incident exited" in text, text
    assert "RuntimeError: weights missing &lt;!channel&gt; see &lt;http://x|link&gt; &amp; 'rm -rf /'" in text, text
    # Nowhere in any Slack message (the text and its blocks) is a mention, a link or a code span opened.
    for body in got.bodies("/slack"):
        sent = json.dumps(body)
        assert "<!" not in sent and "<http" not in sent and "`rm" not in sent, sent
    # The JSON target is not mrkdwn: it gets the reason as the server wrote it.
    raw = next(b for b in got.bodies("/json") if HOSTILE in (b.get("reason") or ""))
    assert raw["event"] == "incident" and raw["incident"]["cause"] == "exited"
