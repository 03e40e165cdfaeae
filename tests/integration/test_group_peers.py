"""Issue 33, "peers prove who they are", through real daemons: a fake member at a member's address
(a small HTTP server in the test) forges reports and floods answers; the leader believes nothing
it did not sign for, reads none of it past 1 MiB, and never sends it the operator's token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from freeport import free_port
from groupdaemons import TOKEN, Node, group_of, ready

from supervisor.common.waiting import wait_for
from supervisor.config.render import dump_toml

pytestmark = pytest.mark.integration

GIB = 1 << 30


class FakeMember:
    """Whatever answers at a member's address: forged reports ("forge"), or 1.5 GB answers ("flood")."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.seen: list[dict[str, str]] = []
        self.sent = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the answer's end is the connection's close: read it or not

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                fake.seen.append({k.lower(): v for k, v in self.headers.items()})
                n = int(self.headers.get("content-length") or 0)
                if n:
                    self.rfile.read(n)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                if fake.mode == "forge":
                    body = json.dumps(forged_report()).encode()
                    # signature headers of the right shape, made without the group's secret
                    for name, value in (
                        ("x-group-node", "1"),
                        ("x-group-time", f"{time.time():.3f}"),
                        ("x-group-nonce", self.headers.get("x-group-nonce", "0" * 32)),
                        ("x-group-signature", "ab" * 32),
                    ):
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.end_headers()
                chunk = b" " * (1 << 20)
                try:
                    while fake.sent < 1.5 * GIB:
                        self.wfile.write(chunk)
                        fake.sent += len(chunk)
                except OSError:
                    pass  # the leader hung up: it read what it would

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serving(st: dict[str, object]) -> bool:
    """Node 0's server up and healthy (a leader with a member it cannot believe stays `starting` or
    `degraded`: the group is not whole, and that is all it is)."""
    return (
        st["phase"] == "serving"
        and bool(st["serving"]["health_ok"])
        and st["state"] in ("starting", "ready", "degraded")
    )  # type: ignore[index]


def forged_report() -> dict[str, object]:
    return {
        "node": 1, "state": "hung", "phase": "serving", "pid": 4242, "rung": "base", "cause": "rank_died",
        "reason": "rank 1 died (forged)", "ranks": [], "lost_ranks": [4243], "last_progress_s": 0.1,
        "at": time.time(), "incident": None,
    }  # fmt: skip


@pytest.fixture
def group_with_fake(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    made: list[Node] = []
    fakes: list[FakeMember] = []

    def make(mode: str) -> tuple[Node, Node, FakeMember]:
        leader, worker = group_of(tmp_path)
        fake = FakeMember(mode)
        fakes.append(fake)
        g = leader.settings.group
        assert g is not None
        # The leader asks the fake where node 1's daemon should be; the real node 1 still runs
        # (its simulated server is the rendezvous partner of node 0's) but is never asked.
        leader.settings = leader.settings.model_copy(
            update={"group": g.model_copy(update={"members": (fake.address,)})}
        )
        leader.config.write_text(dump_toml(leader.settings))
        made.extend((leader, worker))
        for n in (leader, worker):
            n.start()
        return leader, worker, fake

    yield make
    for n in reversed(made):
        n.cleanup()
    for f in fakes:
        f.close()


def test_a_fake_member_forging_rank_died_causes_nothing_and_never_sees_the_token(group_with_fake) -> None:  # type: ignore[no-untyped-def]
    leader, worker, fake = group_with_fake("forge")
    leader.wait(serving, 90, "node 0 serving")
    polls = len(fake.seen)
    wait_for(lambda: len(fake.seen), lambda n: n >= polls + 5, 30, what="five more polls of the fake")
    st = leader.wait(lambda s: s["group"]["status"] == "degraded", 20, "the fake named in degraded")
    node1 = st["group"]["nodes"][1]
    assert node1["reachable"] is False and "signature does not verify" in node1["error"], node1
    assert node1["cause"] is None and node1["state"] is None  # nothing of the forged report is kept
    assert st["incidents"] == 0 and st["restarts"] == 0 and serving(st)
    assert not leader.events("group_incident") and not leader.events("group_evidence")
    assert not leader.events("incident")
    # The leader sent the fake its signed requests, never the operator's bearer token.
    assert all("authorization" not in h for h in fake.seen)
    assert all(h.get("x-group-node") == "1" and len(h.get("x-group-signature", "")) == 64 for h in fake.seen)
    assert TOKEN not in json.dumps(fake.seen)
    assert worker.wait(ready, 10, "the real node 1 untouched")["restarts"] == 0


def test_a_member_answering_1_5_gb_leaves_the_leaders_memory_bounded(group_with_fake) -> None:  # type: ignore[no-untyped-def]
    leader, _worker, fake = group_with_fake("flood")
    leader.wait(serving, 90, "node 0 serving")
    assert leader.proc is not None
    proc = psutil.Process(leader.proc.pid)
    peak = 0
    polls = len(fake.seen)

    def sample() -> int:
        nonlocal peak
        peak = max(peak, proc.memory_info().rss)
        return len(fake.seen)

    wait_for(sample, lambda n: n >= polls + 5, 60, what="five more polls of the flooding fake", interval=0.05)
    st = leader.wait(lambda s: s["group"]["status"] == "degraded", 20, "the flooding fake named in degraded")
    node1 = st["group"]["nodes"][1]
    assert "over 1048576 bytes" in node1["error"], node1
    rss = proc.memory_info().rss
    # Each poll reads 1 MiB and hangs up; the fake would have sent 1.5 GB a time.
    assert peak < 400 * (1 << 20), f"leader RSS peaked at {peak / (1 << 20):.0f} MiB"
    assert rss < 400 * (1 << 20)
    assert fake.sent < 0.5 * GIB * (len(fake.seen) - polls + 1)  # the fake was cut off, not read to the end
    assert st["incidents"] == 0


def test_anonymous_group_stop_on_a_tokenless_loopback_daemon_is_refused(tmp_path: Path) -> None:
    leader, worker = group_of(tmp_path)
    # The worker holds only its own key (what `group-key` prints from the leader's config), not the secret.
    out = subprocess.run(
        [sys.executable, "-m", "supervisor", "group-key", "--config", str(leader.config), "--node", "1"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    key = tmp_path / "node1.key"
    key.write_text(out + "\n")
    key.chmod(0o600)
    g = worker.settings.group
    assert g is not None
    worker.settings = worker.settings.model_copy(
        update={"group": g.model_copy(update={"secret_file": None, "key_file": str(key)})}
    )
    worker.config.write_text(dump_toml(worker.settings))
    for n in (leader, worker):
        n.token = None  # no [api] token at all: the operator's API is open on loopback
        n.start()
    try:
        worker.wait(ready, 90, "the worker ready")
        leader.wait(lambda s: s["group"]["nodes"][1]["state"] == "ready", 30, "the leader reading node 1 (key_file)")
        assert worker.get("/status", auth=False).status_code == 200  # open, as configured
        r = worker.post("/group/stop", {})  # no group signature (and the bearer it sends means nothing here)
        assert r.status_code == 401 and "group request refused" in r.text, r.text
        r = worker.signed("GET", "/group/report")
        assert r.status_code == 200 and r.json()["node"] == 1  # the group's own requests still work
        time.sleep(1.0)
        st = worker.status()
        assert st is not None and st["state"] == "ready" and st["restarts"] == 0  # nothing was stopped
    finally:
        for n in (worker, leader):
            n.cleanup()


def test_a_group_without_credentials_is_refused_at_start_with_a_clear_message(tmp_path: Path) -> None:
    (leader, _worker) = group_of(tmp_path)
    g = leader.settings.group
    assert g is not None
    bare = leader.settings.model_copy(update={"group": g.model_copy(update={"secret_file": None})})
    leader.config.write_text(dump_toml(bare))
    env = {**os.environ, "SGLANG_SUPERVISOR_TOKEN": TOKEN}
    run = [sys.executable, "-m", "supervisor", "run", "--config", str(leader.config)]
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "[group] has no credentials" in done.stderr, done.stderr
    assert "secret_file" in done.stderr
    check = [sys.executable, "-m", "supervisor", "check-config", "--config", str(leader.config)]
    done = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "group.secret_file" in done.stdout + done.stderr, done.stdout + done.stderr
    # A secret others can read is refused by name too.
    secret = Path(str(g.secret_file))
    secret.chmod(0o644)
    leader.config.write_text(dump_toml(leader.settings))
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "chmod 600" in done.stderr, done.stderr
