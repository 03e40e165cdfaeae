"""Hostile peers (issue 33): a fake member at a member's address, against a real group leader.

The group is two real daemons on loopback (bench.multinode's configs, signed with the group's
secret); node 0's config names as its member not node 1's daemon but a fake served here, which
node 0 polls like any member. At rest the fake relays every request to node 1's real daemon and
its answer back (the group is whole); under attack it answers on its own, without the group's key:

  peer_forged_report  a report of `cause: rank_died` with signature headers of the right shape
  peer_giant_answer   1.5 GB of answer to every request (200, then spaces until the leader hangs up)

then it relays again for the figures after. The leader holds an operator token (`[api] token_file`);
the fake looks for it in every request it gets. The test suite's counterpart:
tests/integration/test_group_peers.py.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from bench.common import Daemon, workdir
from supervisor.common.waiting import WaitTimeout

PEER_ATTACKS = ("peer_forged_report", "peer_giant_answer")
MODES = {"peer_forged_report": "forge", "peer_giant_answer": "flood"}
GIANT = 1536 << 20  # bytes the fake offers to each request under peer_giant_answer
TOKEN = "hostile-peers-operator-token-5d81c0"
HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "server", "date"}
)


def forged_report() -> dict[str, object]:
    """A member's report that, believed, is an incident: a rank of node 1 died."""
    return {
        "node": 1, "state": "hung", "phase": "serving", "pid": 4242, "rung": "base", "cause": "rank_died",
        "reason": "rank 1 died (forged)", "ranks": [], "lost_ranks": [4243], "last_progress_s": 0.1,
        "at": time.time(), "incident": None,
    }  # fmt: skip


class FakeMember:
    """What answers at node 1's address: a relay to `relay_to` (mode "relay"), forged reports
    ("forge") or 1.5 GB answers ("flood"). Counts requests and bytes per mode and whether any
    request carried `token`."""

    def __init__(self, relay_to: str, token: str) -> None:
        self.mode = "relay"
        self.relay_to = relay_to
        self.token = token
        self.requests: dict[str, int] = {}
        self.sent: dict[str, int] = {}
        self.token_seen = 0
        self.authorization_seen = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the answer's end is the connection's close: read it or not

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                mode = fake.mode
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else b""
                fake._saw(mode, dict(self.headers.items()), body)
                try:
                    if mode == "forge":
                        self._forge()
                    elif mode == "flood":
                        self._flood()
                    else:
                        self._relay(body)
                except OSError:
                    pass  # the leader hung up: it read what it would

            def _forge(self) -> None:
                out = json.dumps(forged_report()).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                # signature headers of the right shape, made without the group's secret
                for name, value in (
                    ("x-group-node", "1"),
                    ("x-group-time", f"{time.time():.3f}"),
                    ("x-group-nonce", self.headers.get("x-group-nonce", "0" * 32)),
                    ("x-group-signature", "ab" * 32),
                ):
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(out)
                fake._count("forge", len(out))

            def _flood(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                chunk = b" " * (1 << 20)
                left = GIANT
                while left > 0:
                    self.wfile.write(chunk)
                    fake._count("flood", len(chunk))
                    left -= len(chunk)

            def _relay(self, body: bytes) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP and k.lower() != "host"}
                try:
                    r = httpx.request(
                        self.command, fake.relay_to + self.path, content=body, headers=headers, timeout=10,
                        trust_env=False,
                    )  # fmt: skip
                except httpx.HTTPError:
                    self.send_error(502)
                    return
                self.send_response(r.status_code)
                for k, v in r.headers.multi_items():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)
                fake._count("relay", len(r.content))

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="fake-member", daemon=True).start()

    def _saw(self, mode: str, headers: dict[str, str], body: bytes) -> None:
        with self._lock:
            self.requests[mode] = self.requests.get(mode, 0) + 1
            if any(k.lower() == "authorization" for k in headers):
                self.authorization_seen += 1
            if self.token in json.dumps(headers) or self.token.encode() in body:
                self.token_seen += 1

    def _count(self, mode: str, n: int) -> None:
        with self._lock:
            self.sent[mode] = self.sent.get(mode, 0) + n

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Leader(Daemon):
    """Node 0's daemon with an operator token: its `/status` is read with the token."""

    def status(self) -> dict[str, Any] | None:
        try:
            r = httpx.get(
                f"{self.api}/status", timeout=3, trust_env=False, headers={"Authorization": f"Bearer {TOKEN}"}
            )
            data: dict[str, Any] = r.json()
        except (httpx.HTTPError, ValueError):
            return None
        return data if r.status_code == 200 else None


def serving(st: dict[str, Any]) -> bool:
    """Node 0's server up and healthy (with a member it cannot believe it stays `starting` or `degraded`)."""
    sv = st.get("serving") or {}
    return (
        st.get("phase") == "serving"
        and bool(sv.get("health_ok"))
        and st.get("state") in ("starting", "ready", "degraded")
    )


def size(n: int) -> str:
    """Bytes as the table writes them: KB under a MB, MB under a GB, else GB."""
    if n < 1 << 20:
        return f"{n / 1024:.0f} KB"
    if n < 1 << 30:
        return f"{n / (1 << 20):.0f} MB"
    return f"{n / (1 << 30):.1f} GB"


def group_status(st: dict[str, Any] | None) -> str:
    return str(((st or {}).get("group") or {}).get("status") or "?")


def leader_config(wd: Path) -> tuple[Leader, Daemon, Path]:
    """node 0's daemon (token, member: to be set) and node 1's, with the group's configs."""
    from bench.multinode import group_daemons

    base, worker = group_daemons(wd)
    token_file = wd / "operator-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    return Leader(base.settings, base.wd), worker, token_file


def with_member(leader: Leader, member: str, token_file: Path) -> Leader:
    """The leader's config with `member` as node 1's address and the operator token file."""
    s = leader.settings
    g = s.group
    assert g is not None
    settings = s.model_copy(
        update={
            "group": g.model_copy(update={"members": (member,)}),
            "api": s.api.model_copy(update={"token_file": str(token_file)}),
        }
    )
    return Leader(settings, leader.wd)


def run_peer_attack(name: str, seconds: float, watch: Callable[[str, int], Any]) -> dict[str, Any]:
    """`name` against a real leader for about `seconds`, with figures at rest before and after.
    `watch(api, pid)` is the hostile benchmark's Watch (a context manager with `summary()`)."""
    wd = workdir(f"hostile-{name}")
    base, worker, token_file = leader_config(wd)
    fake = FakeMember(worker.api, TOKEN)
    leader = with_member(base, fake.address, token_file)
    try:
        worker.start()
        leader.start()
        leader.wait(serving, 120, "node 0 serving")
        with contextlib.suppress(WaitTimeout):  # the group whole through the relay: recorded, not required
            leader.wait(lambda s: group_status(s) == "ok", 60, "the group whole through the relay")
        st0 = leader.status() or {}
        with watch(leader.api, leader.pid) as rest:
            time.sleep(3)
        before = rest.summary()
        group_rest = group_status(leader.status())
        relayed = fake.requests.get("relay", 0)
        mode = MODES[name]
        fake.mode = mode
        t0 = time.monotonic()
        with watch(leader.api, leader.pid) as w:
            time.sleep(seconds)
            group_attack = group_status(leader.status())
            fake.mode = "relay"
        attack_s = time.monotonic() - t0
        during = w.summary()
        with watch(leader.api, leader.pid) as after_w:
            time.sleep(3)
        after = after_w.summary()
        st1 = leader.status() or {}
        incident_events = [
            e for e in leader.events() if e.get("event") in ("incident", "group_incident", "group_evidence")
        ]
        extra = {
            "polls": fake.requests.get(mode, 0),
            "served": size(fake.sent.get(mode, 0))
            + (f" of {size(GIANT * fake.requests.get(mode, 0))} offered" if mode == "flood" else ""),
            "incidents": int(st1.get("incidents", 0)) - int(st0.get("incidents", 0)),
            "restarts": int(st1.get("restarts", 0)) - int(st0.get("restarts", 0)),
            "token_seen": "yes" if fake.token_seen or fake.authorization_seen else "no",
            "group": f"{group_rest}/{group_attack}/{group_status(st1)}",
        }
        return {
            "attack": name,
            "rest": before,
            "attack_figures": during,
            "after": after,
            "extra": extra,
            "state_after": st1.get("state"),
            "attack_s": round(attack_s, 1),
            "relayed_at_rest": relayed,
            "incident_events": len(incident_events),
        }
    finally:
        fake.mode = "relay"
        leader.stop()
        worker.stop()
        fake.close()
