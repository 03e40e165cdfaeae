"""Hostile clients (issue 33): each attack against a real daemon, with its RSS, descriptors and
`/livez` latency at rest and under attack.

The attacks, all on loopback against `python -m supervisor run` supervising the simulator:
  metrics_pipeline  260 connections pipelining `GET /metrics`, never reading an answer
  livez_pipeline    40 connections pipelining `GET /livez`, never reading
  probe_pipeline    260 connections pipelining 2,000 `GET /livez` a send with a 1 KiB receive buffer
                    (issue 50), never reading; `/status` asked meanwhile
  login_flood       4 clients posting wrong tokens to `/ui/login` as fast as they are answered (issue 50)
  follow_streams    260 `GET /events?follow=true` streams, read as they come
  giant_line        8 `GET /logs` at once on a log whose last line is 300 MB
  stalled_followers 20 `GET /logs?follow=true` that stop reading during a 200 MB log flood, then go
  handoff_squat     a second process looping `bind()` on the API port (bench/squatter.py) while the
                    daemon is handed off with SIGUSR2 3 times (issue 50); `/status` asked with the token after
  peer_forged_report  (a group leader) a fake member forging `cause: rank_died` (bench/hostile_peers.py)
  peer_giant_answer   (a group leader) a fake member answering 1.5 GB to each of the leader's requests
  cache_symlink     links planted in a shared `cache_dir` (bench/hostile_caches.py, issue 50)
  shared_cache      two daemons on one `cache_dir` (bench/hostile_caches.py, issue 50)
  bundles_get_traversal, state_file_nan, cookie_other_port: issue 50's attacks from beside the daemon
                    (a lying answering side for the CLI, planted state files, a service on another
                    port; bench/hostile_local.py)

A prober opens a fresh connection for `/livez` every 0.2 s (2 s timeout: a failure) while a sampler
reads the daemon's VmRSS and open descriptors from /proc. The test suite (tests/integration/
test_hostile_clients.py) drives the same attacks and asserts that they hold.

    .venv/bin/python -m bench.hostile                 # every attack, ~4 minutes, writes the section
    .venv/bin/python -m bench.hostile --only giant_line --no-write

`--only` measures those attacks and keeps the other rows of the published table (and the section's
text after it) as they were, with a note of when they were measured.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.hostile_caches import CACHE_ATTACKS
from bench.hostile_local import LOCAL_ATTACKS, cookie_other_port
from bench.hostile_peers import PEER_ATTACKS
from bench.report import REPORT, table

API_ATTACKS = (
    "metrics_pipeline",
    "livez_pipeline",
    "probe_pipeline",
    "login_flood",
    "follow_streams",
    "giant_line",
    "stalled_followers",
    "handoff_squat",
)
ATTACKS = (*API_ATTACKS, *PEER_ATTACKS, *CACHE_ATTACKS, *LOCAL_ATTACKS)
GAP = "output_gap"  # not an attack on the API: what the server writes while daemon and keeper are gone
GAP_REQUESTS = 200
PROBE_EVERY_S = 0.2
PROBE_TIMEOUT_S = 2.0


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


@dataclass
class Watch:
    """`/livez` latencies and failures, and the daemon's RSS and descriptors, sampled meanwhile."""

    api: str
    pid: int
    timeout_s: float = PROBE_TIMEOUT_S  # a /livez not answered 200 within this is a failure
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Watch:
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._probe, self._sample)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def _probe(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                r = httpx.get(
                    f"{self.api}/livez", timeout=self.timeout_s, headers={"Connection": "close"}, trust_env=False
                )
                if r.status_code == 200:
                    self.latencies.append(time.monotonic() - t0)
                else:
                    self.failures.append(f"HTTP {r.status_code}: {r.text[:120]}")
            except httpx.HTTPError as err:
                self.failures.append(type(err).__name__)
            self._stop.wait(max(0.0, PROBE_EVERY_S - (time.monotonic() - t0)))

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.rss.append(rss_mb(self.pid))
            self.fds.append(fds(self.pid))
            self._stop.wait(0.25)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")

        return {
            "livez_ok": len(lat),
            "livez_failed": len(self.failures),
            "livez_p50_ms": pct(0.5),
            "livez_p99_ms": pct(0.99),
            "rss_peak_mb": max(self.rss, default=0.0),
            "fds_peak": max(self.fds, default=0),
            "failures": self.failures[:5],
        }


def _connect(port: int, rcvbuf: int | None = None) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf is not None:  # before connect: the window the daemon may fill
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    return s


@contextlib.contextmanager
def pipelining(
    port: int, n: int, path: str, *, repeat: int = 64, rcvbuf: int | None = None
) -> Iterator[dict[str, int]]:
    """`n` connections that send `repeat` pipelined `GET path` at a time as fast as the daemon takes
    them and never read an answer (`rcvbuf`: their receive buffer); a connection the daemon closes is
    opened again (an attacker persists)."""
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode() * repeat
    counts = {"opened": 0, "closed_by_daemon": 0}
    stop = threading.Event()

    def run() -> None:
        socks: list[socket.socket | None] = [None] * n
        while not stop.is_set():
            for i in range(n):
                s = socks[i]
                if s is None:
                    s = socks[i] = _connect(port, rcvbuf)
                    if s is None:
                        continue
                    counts["opened"] += 1
                try:
                    s.send(request)
                except BlockingIOError:
                    continue
                except OSError:
                    counts["closed_by_daemon"] += 1
                    s.close()
                    socks[i] = None
            stop.wait(0.02)
        for s in socks:
            if s is not None:
                s.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield counts
    finally:
        stop.set()
        t.join(30)


@contextlib.contextmanager
def following(port: int, n: int, path: str, *, read: Callable[[float], bool]) -> Iterator[dict[str, int]]:
    """`n` follow streams on `path`; each reads while `read(now)` says so, then stops reading.
    Counts the streams answered 200 and those refused (503), once each has answered (or 30 s).

    A stream's first answer is taken whenever it comes, reading or not: on a loaded machine the
    daemon may answer after the reading window is over (all 20 stalled followers once answered
    after their 1 s window and were counted as never started), and such a stream then stalls
    like the others."""
    counts = {"streaming": 0, "refused": 0, "failed": 0}
    socks: list[socket.socket] = []
    for _ in range(n):
        s = _connect(port)
        if s is None:
            counts["failed"] += 1
            continue
        s.setblocking(True)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        socks.append(s)
    stop = threading.Event()
    status: dict[socket.socket, bytes] = {}

    def run() -> None:
        sel = selectors.DefaultSelector()
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        while not stop.is_set():
            reading = read(time.monotonic())
            for key, _ in sel.select(0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if not reading and sock in status:
                    continue  # stalled: what the daemon sends waits in the kernel
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if sock not in status and data:
                    status[sock] = data[:12]
                if not data:
                    sel.unregister(sock)
            if not reading:
                stop.wait(0.1)  # the stalled streams stay readable: select returns at once

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while len(status) < len(socks) and time.monotonic() < deadline:
            time.sleep(0.1)
        counts["streaming"] = sum(1 for v in status.values() if v.startswith(b"HTTP/1.1 200"))
        counts["refused"] = sum(1 for v in status.values() if v.startswith(b"HTTP/1.1 503"))
        yield counts
    finally:
        stop.set()
        t.join(10)
        for s in socks:
            s.close()


def write_giant_line(log: Path, size: int) -> None:
    """Append one line of `size` bytes (what a server printing a huge tensor would leave)."""
    block = b"g" * (1 << 20)
    with open(log, "ab") as f:
        f.write(b"a line before the giant one\n")
        left = size
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
        f.write(b"\n")


def flood_log(log: Path, size: int, stop: threading.Event | None = None) -> None:
    """Append `size` bytes of ordinary log lines as fast as the disk takes them."""
    line = b"flood " + b"f" * 120 + b"\n"
    block = line * 8000
    with open(log, "ab") as f:
        left = size
        while left > 0 and not (stop is not None and stop.is_set()):
            f.write(block)
            left -= len(block)


def timed_gets(api: str, path: str, n: int, timeout: float) -> list[tuple[float, int, int]]:
    """`n` concurrent GETs of `path`: (seconds, status or -1, bytes) for each."""
    out: list[tuple[float, int, int]] = []

    def one() -> None:
        t0 = time.monotonic()
        try:
            r = httpx.get(f"{api}{path}", timeout=timeout, trust_env=False)
            out.append((time.monotonic() - t0, r.status_code, len(r.content)))
        except httpx.HTTPError:
            out.append((time.monotonic() - t0, -1, 0))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return out


def status_answers(api: str, seconds: float) -> list[int]:
    """`GET /status` on a fresh connection every 0.5 s for `seconds`: each answer's status (-1: none
    within 5 s)."""
    out: list[int] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            r = httpx.get(f"{api}/status", timeout=5, headers={"Connection": "close"}, trust_env=False)
            out.append(r.status_code)
        except httpx.HTTPError:
            out.append(-1)
        time.sleep(0.5)
    return out


LOGIN_TOKEN = "hostile-login-flood-token-" + "z" * 16


def login_flood(api: str, seconds: float, clients: int = 4) -> dict[str, int]:
    """`clients` keep-alive clients posting a wrong token to `/ui/login` for `seconds`: how many
    tries, and how many were refused by the token (401) or by the throttle unchecked (429)."""
    counts = {"tries": 0, "refused_401": 0, "throttled_429": 0, "other": 0}
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def one(i: int) -> None:
        with httpx.Client(base_url=api, timeout=10, trust_env=False) as c:
            n = 0
            while time.monotonic() < end:
                n += 1
                try:
                    code = c.post(
                        "/ui/login",
                        content=f"token=guess-{i}-{n}".encode(),
                        headers={"Content-Type": "application/x-www-form-urlencoded"},
                    ).status_code
                except httpx.HTTPError:
                    code = -1
                key = {401: "refused_401", 429: "throttled_429"}.get(code, "other")
                with lock:
                    counts["tries"] += 1
                    counts[key] += 1

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    return counts


def readyz_state(api: str) -> str | None:
    """The state `/readyz` names (an open route: no token needed), or None."""
    try:
        state = httpx.get(f"{api}/readyz", timeout=3, trust_env=False).json().get("state")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return state if isinstance(state, str) else None


def journal_counts(state_dir: Path) -> dict[str, int]:
    """Records in the daemon's journal files: refused logins (and the refusals they stand for), and
    the main file's launch records."""
    import json

    out = {"login_records": 0, "login_refusals": 0, "launch_records": 0, "incident_records": 0}
    for path in sorted(state_dir.glob("events*.jsonl*")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == "page_login_refused":
                out["login_records"] += 1
                out["login_refusals"] += int(rec.get("count", 1))
            elif rec.get("event") == "server_launched" and path.name.startswith("events.jsonl"):
                out["launch_records"] += 1
            elif rec.get("event") == "incident" and path.name.startswith("events.jsonl"):
                out["incident_records"] += 1
    return out


def manual_restart(api: str, token: str) -> None:
    """`POST /restart` (an incident of cause `manual` in the journal), then ready again."""
    bearer = {"Authorization": f"Bearer {token}"}
    r = httpx.post(f"{api}/restart", json={"reason": "hostile bench"}, headers=bearer, timeout=30, trust_env=False)
    r.raise_for_status()
    deadline = time.monotonic() + 120
    time.sleep(1.0)
    while readyz_state(api) != "ready":
        if time.monotonic() > deadline:
            raise TimeoutError("the daemon was not ready again within 120 s of the manual restart")
        time.sleep(0.5)


def run_attack(name: str, api: str, pid: int, port: int, log: Path, seconds: float) -> dict[str, Any]:
    """One attack for about `seconds`, with figures at rest before it and after it."""
    if name == "login_flood":  # an incident record for the flood to leave alone: a manual restart
        manual_restart(api, LOGIN_TOKEN)
    if name == "giant_line":  # the log holds the line before the attack: the daemon's own reader is done with it
        write_giant_line(log, 300 << 20)
        time.sleep(8)
    with Watch(api, pid) as rest:
        time.sleep(3)
    before = rest.summary()
    extra: dict[str, Any] = {}
    with Watch(api, pid) as w:
        if name == "metrics_pipeline":
            with pipelining(port, 260, "/metrics") as c:
                time.sleep(seconds)
            extra = dict(c)
        elif name == "livez_pipeline":
            with pipelining(port, 40, "/livez") as c:
                time.sleep(seconds)
            extra = dict(c)
        elif name == "probe_pipeline":
            with pipelining(port, 260, "/livez", repeat=2000, rcvbuf=1024) as c:
                asked = status_answers(api, seconds)
            extra = {**c, "status_200": f"{asked.count(200)} of {len(asked)}"}
        elif name == "login_flood":
            # The records the flood must not rotate out, counted before and after (issue 50: 475,701
            # refused logins left /events with 0 incidents).
            kept = journal_counts(log.parent.parent)
            got = login_flood(api, seconds)
            left = journal_counts(log.parent.parent)
            extra = {
                **got,
                "login_records": left["login_records"],
                "login_refusals": left["login_refusals"],
                "launch_records": f"{kept['launch_records']} -> {left['launch_records']}",
                "incident_records": f"{kept['incident_records']} -> {left['incident_records']}",
            }
        elif name == "cookie_other_port":
            extra = cookie_other_port(api, port)
        elif name == "follow_streams":
            with following(port, 260, "/events?follow=true", read=lambda _: True) as c:
                time.sleep(seconds)
            extra = dict(c)
        elif name == "giant_line":
            got = timed_gets(api, "/logs?lines=100", 8, timeout=120)
            extra = {
                "answered": sum(1 for _, st, _ in got if st == 200),
                "slowest_s": round(max((t for t, _, _ in got), default=0.0), 2),
                "largest_kb": max((b for _, _, b in got), default=0) // 1024,
            }
        elif name == "stalled_followers":
            t0 = time.monotonic()
            with following(port, 20, "/logs?follow=true&lines=0", read=lambda now: now - t0 < 1.0) as c:
                time.sleep(max(0.0, 1.5 - (time.monotonic() - t0)))
                flood_log(log, 200 << 20)
                time.sleep(2)
            extra = dict(c)
            time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
        elif name == "handoff_squat":
            extra = handoff_squat(api, pid, port, log.parent.parent)
        else:
            raise ValueError(name)
    during = w.summary()
    with Watch(api, pid) as after_w:
        time.sleep(3)
    after = after_w.summary()
    return {"attack": name, "rest": before, "attack_figures": during, "after": after, "extra": extra}


# ---- handoff_squat (issue 50): the port and the token during SIGUSR2 handoffs ----

HANDOFFS = 3


def _alive(pid: int) -> bool:
    """Running, not a zombie its parent (this bench) has yet to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def handoff_squat(api: str, pid: int, port: int, state_dir: Path) -> dict[str, Any]:
    """A squatter loops binding the API port while the daemon is handed off HANDOFFS times, and a
    client asks `/status` with the token every 0.2 s meanwhile (an operator's `status --watch`).
    Before issue 50 the squatter won the gap and was sent the token."""
    import json
    import signal

    from bench.squatter import Squatter

    def adopted() -> int:
        path = state_dir / "events.jsonl"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return sum(json.loads(x).get("event") == "server_adopted" for x in lines if x.strip())

    headers = {"Authorization": f"Bearer {LOGIN_TOKEN}"}

    def ask() -> int:
        try:
            return httpx.get(f"{api}/status", headers=headers, timeout=PROBE_TIMEOUT_S, trust_env=False).status_code
        except httpx.HTTPError:
            return -1

    asked: list[int] = []
    halt = threading.Event()

    def asker() -> None:
        while not halt.wait(PROBE_EVERY_S):
            asked.append(ask())

    token = state_dir.parent / "squat-token"
    token.write_text(LOGIN_TOKEN + "\n")
    token.chmod(0o600)
    squatter = Squatter("127.0.0.1", port, state_dir.parent / "squat.json", token)
    client = threading.Thread(target=asker, daemon=True)
    client.start()
    done = 0
    try:
        time.sleep(1)
        for _ in range(HANDOFFS):
            before = adopted()
            os.kill(pid, signal.SIGUSR2)
            deadline = time.monotonic() + 180  # the new code's preflight, then its start
            while adopted() <= before and time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            if adopted() <= before:
                break
            done += 1
            time.sleep(2)
    finally:
        halt.set()
        client.join(10)
        got = squatter.stop()
    return {
        "handoffs": f"{done} of {HANDOFFS}",
        "squatter_binds": f"{got.get('won')} won of {got.get('tries')}",
        "token_leaked": got.get("got_token"),
        "status_200_during": f"{asked.count(200)} of {len(asked)}",
        "status_after": ask(),
        "daemon_alive": _alive(pid),
    }


def _keeper_of(server_pid: int) -> int | None:
    import psutil

    pipe = os.readlink(f"/proc/{server_pid}/fd/1")
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "supervisor.logs.keeper" in (p.info["cmdline"] or []) and os.readlink(f"/proc/{p.pid}/fd/0") == pipe:
                return int(p.pid)
        except OSError:
            continue
    return None


def output_gap() -> dict[str, Any]:
    """Kill the daemon and its log keeper (SIGKILL both), send GAP_REQUESTS requests to the server
    (each writes one access-log line), start a successor, send 20 more: which lines reached the log?"""
    import re
    import signal

    from bench.common import Daemon, sim_settings, workdir

    access = re.compile(r'"POST /generate\?(\S+) HTTP/1\.1" 200')
    wd = workdir("hostile-gap")
    settings = sim_settings(wd, "ok", tp=1)
    port = settings.server.port

    def generate(tag: str) -> int:
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
        try:
            return httpx.post(f"http://127.0.0.1:{port}/generate?{tag}", json=body, timeout=10).status_code
        except httpx.HTTPError:
            return -1

    first = Daemon(settings, wd).start()
    second = Daemon(settings, wd)
    try:
        server = first.wait(lambda st: st.get("state") == "ready", 120, "ready")["pid"]
        assert first.proc is not None
        first.proc.kill()
        first.proc.wait(30)
        keeper = _keeper_of(server)
        if keeper is not None:
            os.kill(keeper, signal.SIGKILL)
        time.sleep(0.3)
        t0 = time.monotonic()
        answered = sum(generate(f"gap={i}") == 200 for i in range(GAP_REQUESTS))
        gap_s = time.monotonic() - t0
        second.start()
        second.wait(
            lambda st: st.get("state") == "ready" and bool((st.get("log_keeper") or {}).get("replaced")), 120, "adopted"
        )
        after = sum(generate(f"after={i}") == 200 for i in range(20))
        time.sleep(2)
        logs = Path(settings.state_dir) / "logs"
        seen = set()
        for p in logs.glob("server.log*"):
            seen |= set(access.findall(p.read_text(errors="replace")))
        return {
            "gap_lines": GAP_REQUESTS,
            "gap_answered": answered,
            "gap_s": round(gap_s, 1),
            "gap_kept": sum(f"gap={i}" in seen for i in range(GAP_REQUESTS)),
            "after_answered": after,
            "after_kept": sum(f"after={i}" in seen for i in range(20)),
        }
    finally:
        second.stop()
        first.stop()


def rows_of(results: list[dict[str, Any]]) -> list[list[object]]:
    """A row per attack; a phase with no daemon to watch (the CLI's row has none; the state files'
    row watches only the start on the planted files) is `-`."""
    rows: list[list[object]] = []
    for r in results:
        rest, d, after = r["rest"], r["attack_figures"], r["after"]

        def fig(x: dict[str, Any] | None, key: str, form: str = "{:.0f}") -> str:
            return "-" if x is None else form.format(x[key])

        rows.append(
            [
                r["attack"],
                " / ".join(fig(x, "rss_peak_mb") for x in (rest, d, after)),
                " / ".join(fig(x, "fds_peak", "{}") for x in (rest, d, after)),
                " / ".join(fig(rest, k, "{:.1f}") for k in ("livez_p50_ms", "livez_p99_ms")),
                " / ".join(fig(d, k, "{:.1f}") for k in ("livez_p50_ms", "livez_p99_ms")),
                "-" if d is None else f"{d['livez_failed']} of {d['livez_ok'] + d['livez_failed']}",
                ", ".join(f"{k} {v}" for k, v in r["extra"].items()),
            ]
        )
    return rows


COLUMNS = (
    "attack",
    "RSS MB rest / peak / after",
    "fds rest / peak / after",
    "/livez p50 / p99 ms at rest",
    "/livez p50 / p99 ms under attack",
    "/livez failed",
    "what the attack got",
)


KEPT_NOTE = re.compile(r"Rows kept from an earlier run \(`--only`\), measured (.+? UTC on [^:]+?): ([^.]+)\.")
GAP_PARAGRAPH = "Output written while the daemon and its log keeper are both gone"


@dataclass(frozen=True)
class Published:
    """The published Hostile clients section, as `--only` keeps it: each attack's row (its cells as
    written, and when it was measured), the output-gap paragraph, and the text after the table."""

    rows: dict[str, tuple[list[str], str]]
    gap: str
    prose: str


def published(path: Path | None = None) -> Published:
    """The published section of docs/BENCHMARKS.md (or `path`)."""
    try:
        text = (path or REPORT).read_text()
    except OSError:
        return Published({}, "", "")
    m = re.search(r"<!-- section:hostile -->(.*?)<!-- /section:hostile -->", text, re.S)
    if m is None:
        return Published({}, "", "")
    section = m.group(1)
    stamp = re.search(r"^Measured (\d{4}-\d\d-\d\d \d\d:\d\d UTC on [^;]+)", section, re.M)
    when = {name: note[1] for note in KEPT_NOTE.finditer(section) for name in note[2].split(", ")}
    rows: dict[str, tuple[list[str], str]] = {}
    lines = section.strip("\n").splitlines()
    last = -1
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            continue
        last = i
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ATTACKS:
            rows[cells[0]] = (cells, when.get(cells[0], stamp[1] if stamp else "at an unknown time"))
    after = "\n".join(lines[last + 1 :]).strip() if last >= 0 else ""
    paragraphs = [x.strip() for x in re.split(r"\n\s*\n", after) if x.strip()]
    gap = next((x for x in paragraphs if x.startswith(GAP_PARAGRAPH)), "")
    if gap:  # no cells: the paragraph is the output gap's row
        rows[GAP] = ([], when.get(GAP, stamp[1] if stamp else "at an unknown time"))
    prose = "\n\n".join(x for x in paragraphs if not x.startswith(GAP_PARAGRAPH))
    return Published(rows, gap, prose)


def gap_paragraph(gap: dict[str, Any]) -> str:
    return (
        f"{GAP_PARAGRAPH} (both SIGKILLed; the server, "
        f"still serving, answers {gap['gap_lines']} requests in {gap['gap_s']:g} s, one access-log line "
        f"each; then a successor adopts the server and starts a new keeper): {gap['gap_kept']} of "
        f"{gap['gap_lines']} lines written in the gap reach the log ({gap['gap_answered']} requests "
        f"answered), {gap['after_kept']} of {gap['after_answered']} after the successor. "
        "The loss is by choice (docs/SAFETY.md, issue 33)."
    )


def render(
    results: list[dict[str, Any]],
    seconds: float,
    *,
    kept: dict[str, tuple[list[str], str]] | None = None,
    gap: str = "",
    prose: str = "",
) -> str:
    """The section: this run's rows and the `kept` ones (attack -> cells, when measured; the entry
    GAP, with no cells, says the `gap` paragraph is kept), in ATTACKS' order."""
    from bench.common import header

    kept = kept or {}
    intro = (
        "Each attack for about "
        f"{seconds:g} s against a fresh daemon (simulator, tp 1) on loopback; `/livez` probed on a fresh "
        f"connection every {PROBE_EVERY_S:g} s (a failure: no 200 within httpx's {PROBE_TIMEOUT_S:g} s "
        "timeout, which bounds each phase), RSS and "
        "open descriptors of the daemon sampled every 0.25 s, for 3 s at rest before and after. Before "
        "issue 33's fix: 260 `/metrics` pipeliners kept `/livez` failing for 45 s; 40 `/livez` pipeliners "
        "took the daemon from 68 MB to 1,033 MB; a 300 MB line kept `GET /logs` unanswered past 240 s "
        "and the loop still for 300 s; 20 stalled followers took it to 2.1 GB. Before issue 50's fix: 260 "
        "connections pipelining 2,000 `/livez` a send with a 1 KiB receive buffer (`probe_pipeline`) took "
        "it from 71 MB to 2,146 MB in 20 s, and `/status` answered 503 from the third second on; 475,701 "
        "refused logins in 407 s (no throttle) each wrote a journal record and rotated the incident and "
        "launch records out (`login_flood`: `tries` and what answered them, `login_records` the journal's "
        "records of refused logins and `login_refusals` the refusals they stand for, `launch_records` and "
        "`incident_records` the `server_launched` and `incident` records in events.jsonl before -> after the "
        "flood, a manual restart before it having left one incident). "
        "The two `peer_` rows are the leader of a real two-node group (simulator, tp 2 a node; "
        "bench/hostile_peers.py) whose member "
        "address is a fake served by the benchmark: at rest and after, the fake relays to node 1's real "
        "daemon; under attack it answers without the group's key, a forged `cause: rank_died` report or "
        "1.5 GB to every request; `polls` and `served` are the requests the fake answered under attack and the "
        "bytes it wrote before the leader hung up (the leader reads 1 MiB of an answer at most), `incidents` "
        "and `restarts` what it caused the leader, `token_seen` whether any request "
        "it got in the whole run carried the leader's operator token, `group` the leader's group status "
        "at rest / under attack / after (before the fix: a forged report made the leader stop and "
        "relaunch the group twice, leaving it `failed`; 1.5 GB took it from 69 MB to 1,651 MB, never "
        "given back). "
        "The last three rows are issue 50's attacks from beside the daemon (bench/hostile_local.py): "
        "`bundles_get_traversal` runs the real CLI `sglang-supervisor bundles get B` against a fake daemon "
        "(no daemon to watch: `-`) that lists `../../x`, `../escaped` and an absolute name, redirects the "
        "download to another port, or finds a dangling symlink planted at `./B` (`cli_exit` for each, "
        "`written_outside_id` the files that appeared outside `./B` or at the absolute name, "
        "`token_to_other_port` the requests carrying the token that the other port got; before the fix: "
        "written wherever the names pointed, the token sent with each); `state_file_nan` starts the daemon "
        "with FIFOs named `launches.json` and `state.json` (`livez_s_with_fifos`/`ready_s_with_fifos` "
        "after its start; before: "
        "never), then on a book whose learned quiet intervals were replaced by NaN, inf, 1e308 and -5 "
        "(`window_in_force` every start-up stall window `/status` showed during that start, against "
        "`configured`; `quiet_intervals_poisoned` how many were replaced, `journal_dropped` the journal's "
        "`launch_book_unreadable` records of the entries dropped; before: a NaN "
        "window, no stall verdict but the backstop), its RSS and `/livez` watched during that start only; "
        "`cookie_other_port` logs in to `/ui/login`, takes the session cookie and the page's CSRF token, "
        "and posts the page's confirmed `stop` form through a relay on another loopback port (forwarding "
        "its own Host and Origin), with another port's Origin (`127.0.0.1` and `localhost`), and with "
        "another port's Host (`answers` in that order; `state_changing_accepted` those that stopped "
        "anything; `same_origin_control` the same cookie and token on the API's own origin opening the "
        "form's confirmation; before: a relay on another port stopped the server)."
    )
    from bench.hostile_caches import INTRO as CACHE_INTRO

    intro += CACHE_INTRO
    by_stamp: dict[str, list[str]] = {}
    for name, (_, when) in kept.items():
        by_stamp.setdefault(when, []).append(name)
    for when, names in by_stamp.items():
        intro += f" Rows kept from an earlier run (`--only`), measured {when}: {', '.join(names)}."
    body = header("Hostile clients: the API against clients that send and never read", "hostile", intro).replace(
        "bench.run_all --only hostile", "bench.hostile"
    )
    rows = rows_of(results) + [
        cells for name, (cells, _) in kept.items() if cells and name not in {r["attack"] for r in results}
    ]
    rows.sort(key=lambda r: ATTACKS.index(str(r[0])) if r[0] in ATTACKS else len(ATTACKS))
    body += "\n" + table(COLUMNS, rows) + "\n"
    if gap:
        body += "\n" + gap + "\n"
    if prose:
        body += "\n" + prose + "\n"
    return body


def main(argv: list[str] | None = None) -> int:
    from bench.common import Daemon, publish, save_result, sim_settings, workdir
    from bench.hostile_local import COOKIE_TOKEN, bundles_get_traversal, state_file_nan
    from bench.hostile_peers import run_peer_attack
    from supervisor.common.waiting import wait_for

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--only",
        action="append",
        choices=(*ATTACKS, GAP),
        help="only these (default: all); the other rows of the published table, and its text, stay",
    )
    p.add_argument("--seconds", type=float, default=20.0, help="how long each attack lasts")
    p.add_argument("--no-write", action="store_true", help="print the section, do not write docs/BENCHMARKS.md")
    a = p.parse_args(argv)
    results: list[dict[str, Any]] = []
    for name in [x for x in ATTACKS if not a.only or x in a.only]:
        if name in CACHE_ATTACKS:
            from bench.hostile_caches import run_cache_attack

            res = run_cache_attack(name, a.seconds, Watch)
            results.append(res)
            print(res, flush=True)
            continue
        if name in PEER_ATTACKS:
            res = run_peer_attack(name, a.seconds, Watch)
            results.append(res)
            print(res, flush=True)
            continue
        wd = workdir(f"hostile-{name}")
        if name == "bundles_get_traversal":
            res = {"attack": name, "rest": None, "attack_figures": None, "after": None}
            results.append({**res, "extra": bundles_get_traversal(wd)})
            print(results[-1], flush=True)
            continue
        if name == "state_file_nan":
            got = state_file_nan(wd, Watch, a.seconds)
            results.append({"attack": name, "rest": None, "attack_figures": got["summary"], "after": None, **got})
            print(results[-1], flush=True)
            continue
        settings = sim_settings(wd, "ok", tp=1)
        if name in ("login_flood", "handoff_squat", "cookie_other_port"):  # a login needs a token; a squatter, to steal
            token = wd / "token"
            token.write_text((COOKIE_TOKEN if name == "cookie_other_port" else LOGIN_TOKEN) + "\n")
            token.chmod(0o600)
            settings = settings.model_copy(update={"api": settings.api.model_copy(update={"token_file": str(token)})})
        with Daemon(settings, wd) as d:
            if settings.api.token_file:  # /status wants the token: /readyz says the state without it
                wait_for(lambda: readyz_state(d.api), lambda st: st == "ready", 120, what="ready")
            else:
                d.wait(lambda s: s.get("state") == "ready", 120, "ready")
            log = settings.state_dir / "logs" / "server.log"
            res = run_attack(name, d.api, d.pid, settings.api.port, log, a.seconds)
            res["state_after"] = readyz_state(d.api) if settings.api.token_file else (d.status() or {}).get("state")
            results.append(res)
            print(res, flush=True)
    save_result("hostile", results)
    old = published() if a.only else Published({}, "", "")
    kept = {k: v for k, v in old.rows.items() if k not in (a.only or ())}
    gap = old.gap if GAP in kept else ""
    if not a.only or GAP in a.only:
        measured = output_gap()
        print(measured, flush=True)
        gap = gap_paragraph(measured)
    body = render(results, a.seconds, kept=kept, gap=gap, prose=old.prose)
    if a.no_write:
        print(body)
    else:
        publish("hostile", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
