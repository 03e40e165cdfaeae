"""Issue 33's attacks through a real daemon process (`python -m supervisor run`): clients that send
and never read, too many follow streams, a 300 MB log line, followers that stall during a flood.

Each holds when `/livez` keeps answering 200 (a fresh connection, 5 s client timeout) during the
attack and the daemon's RSS stays bounded; the figures are in docs/BENCHMARKS.md (bench/hostile.py,
which these tests share the attacks with).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import httpx
import pytest
from daemonproc import cleanup, start, wait_status

from bench import hostile
from supervisor.config.render import dump_toml as to_toml

pytestmark = pytest.mark.integration

# Far below what the attacks took before the fix (+965 MB for the /livez pipeliners, +2 GB for
# stalled followers) and above what a loaded machine adds at rest.
RSS_GROWTH_MB = 250
PROBE_TIMEOUT_S = 10.0  # generous on a loaded machine: before the fix /livez did not answer at all


@pytest.fixture
def running(sim, tmp_path: Path):  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    try:
        wait_status(api, lambda st: st.get("state") == "ready", 120, proc)
        yield s, api, proc
    finally:
        cleanup(proc, str(s.paths.state_dir))


def watch(api: str, pid: int) -> hostile.Watch:
    return hostile.Watch(api, pid, timeout_s=PROBE_TIMEOUT_S)


def answers_livez(api: str, within_s: float) -> bool:
    """/livez answers 200 within `within_s` (on a loaded machine the daemon may still be digesting a flood)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{api}/livez", timeout=10).status_code == 200:
                return True
        time.sleep(0.5)
    return False


def status_within(url: str, seconds: float) -> int | str:
    """The first 200 within `seconds`, else the last answer (a status, or the transport error's name)."""
    deadline, last = time.monotonic() + seconds, "none"
    while True:
        try:  # a refused or reset connection is an answer missed, not a crash of the test
            r = httpx.get(url, timeout=10, headers={"Connection": "close"})
            if r.status_code == 200:
                return 200
            last = str(r.status_code)
        except httpx.TransportError as err:
            last = type(err).__name__
        if time.monotonic() >= deadline:
            return last
        time.sleep(0.5)


def livez_held(w: hostile.Watch) -> None:
    assert w.latencies, "no /livez answered during the attack"
    assert not w.failures, f"/livez failed during the attack: {w.failures[:5]} ({len(w.latencies)} answered)"


def test_260_connections_pipelining_metrics_without_reading_leave_livez_and_status_answering(running) -> None:  # type: ignore[no-untyped-def]
    s, api, proc = running
    base = hostile.rss_mb(proc.pid)
    with watch(api, proc.pid) as w, hostile.pipelining(s.api.port, 260, "/metrics") as c:
        time.sleep(4)
        # Each ask retries a 503 (a moment on a reserved probe slot answers "busy", as a client told
        # to retry would) for up to 5 s: on a loaded CI machine the cap frees a slot later, not never.
        statuses = [status_within(f"{api}/status", 5.0) for _ in range(5)]
        time.sleep(4)
    livez_held(w)
    assert statuses.count(200) >= 3, statuses
    assert c["closed_by_daemon"] > 0, "connections that never read their answers are closed"
    assert max(w.rss) - base < RSS_GROWTH_MB, (base, max(w.rss))
    # Once the attackers go, their connections go too (the write deadline, or the peer's close).
    deadline = time.monotonic() + 30
    while hostile.fds(proc.pid) > 60 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert hostile.fds(proc.pid) <= 60


def test_40_connections_pipelining_livez_keep_the_daemon_small(running) -> None:  # type: ignore[no-untyped-def]
    s, api, proc = running
    base = hostile.rss_mb(proc.pid)
    with watch(api, proc.pid) as w, hostile.pipelining(s.api.port, 40, "/livez"):
        time.sleep(12)
    livez_held(w)
    assert max(w.rss) - base < RSS_GROWTH_MB, f"RSS {base:.0f} MB at rest, {max(w.rss):.0f} MB under attack"


@pytest.mark.parametrize("path", ["/livez", "/readyz"])
def test_260_probe_pipeliners_with_a_tiny_receive_buffer_leave_the_daemon_small_and_status_answering(
    running, path: str
) -> None:  # type: ignore[no-untyped-def]
    """Issue 50: 260 connections pipelining 2,000 probes a send with a 1 KiB receive buffer took the
    daemon from 71 MB to 4.7 GB in 33 s and `/status` answered 503 for 90 s (the probes were never
    victims at the cap, and every request let uvicorn read 256 KiB more)."""
    s, api, proc = running
    with watch(api, proc.pid) as w, hostile.pipelining(s.api.port, 260, path, repeat=2000, rcvbuf=1024) as c:
        time.sleep(3)
        statuses = [status_within(f"{api}/status", 5.0) for _ in range(5)]
        time.sleep(2)
    livez_held(w)
    assert statuses.count(200) >= 4, statuses
    assert c["closed_by_daemon"] > 0, "pipeliners are closed for newcomers at the cap"
    assert max(w.rss) < 300, f"RSS {max(w.rss):.0f} MB under attack"


def api_connections(pid: int, port: int) -> int:
    """The daemon's established connections on its API port (what it holds for its clients)."""
    import psutil

    conns = psutil.Process(pid).net_connections("tcp")
    return sum(1 for x in conns if x.laddr and x.laddr.port == port and x.status == psutil.CONN_ESTABLISHED)


@pytest.mark.parametrize("path", ["/status", "/no-such-route"])
def test_pipeliners_on_any_route_from_one_address_have_a_total_budget(running, path: str) -> None:  # type: ignore[no-untyped-def]
    """Issue 50's Build: every route's pipelining is bounded by what a connection holds, not by which
    route it is, and one address's connections have a total budget. 200 connections from 127.0.0.1
    pipelining 2,000 requests a send of a route that is neither a probe nor /metrics (an answered one,
    and a 404), with a 1 KiB receive buffer: the daemon holds about PIPELINER_SHARE of its cap for them
    (the oldest is closed for each newcomer beyond it), stays under 300 MB, and /status and /livez
    answer."""
    from supervisor.host.apiguard import MAX_CONNECTIONS, PIPELINER_SHARE

    s, api, proc = running
    held: list[int] = []
    n = 200  # fewer than the cap (256): only the pipeliners' share closes any of them
    with watch(api, proc.pid) as w, hostile.pipelining(s.api.port, n, path, repeat=2000, rcvbuf=1024) as c:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            held.append(api_connections(proc.pid, s.api.port))
            time.sleep(0.25)
        statuses = [status_within(f"{api}/status", 5.0) for _ in range(5)]
    livez_held(w)
    assert statuses.count(200) >= 4, statuses
    # Below the cap nothing but the pipeliners' share closes a connection: with the share at 1.0 none
    # was closed and the daemon held all 200.
    assert c["closed_by_daemon"] > 0, "pipeliners beyond their share of the cap are closed"
    assert max(w.rss) < 300, f"RSS {max(w.rss):.0f} MB under attack"
    # The median, not the peak: a reconnecting attacker's new connection is held for the moment its
    # requests take to arrive (peaks of 194 beside a median of 129 with two attacks on 2 cores).
    budget = int(MAX_CONNECTIONS * PIPELINER_SHARE)
    assert budget < n and sorted(held)[len(held) // 2] < n - 20, (budget, held)


def test_follow_streams_are_capped_and_livez_answers_beside_260_of_them(running) -> None:  # type: ignore[no-untyped-def]
    s, api, proc = running
    with watch(api, proc.pid) as w, hostile.following(s.api.port, 260, "/events?follow=true", read=lambda _: True) as c:
        time.sleep(3)
        r = httpx.get(f"{api}/events?follow=true", timeout=10)
    livez_held(w)
    assert c["streaming"] == 64 and c["refused"] == 260 - 64, c
    assert r.status_code == 503 and r.json()["error"] == "too_many_follows"
    with httpx.stream("GET", f"{api}/events?follow=true&limit=1", timeout=10) as again:  # the slots came back
        assert again.status_code == 200


def test_logs_on_a_300_mb_line_answer_cut_while_livez_stays_fine(running) -> None:  # type: ignore[no-untyped-def]
    s, api, proc = running
    log = Path(s.paths.state_dir) / "logs" / "server.log"
    hostile.write_giant_line(log, 300 << 20)
    with watch(api, proc.pid) as w:
        got = hostile.timed_gets(api, "/logs?lines=50", 8, timeout=120)
        time.sleep(2)
    assert [st for _, st, _ in got] == [200] * 8
    r = httpx.get(f"{api}/logs?lines=2000", timeout=60)  # the server has logged on after it
    # The 16 MiB the tail reads end inside the giant line: its newest 64 KiB, said to be cut, and nothing older.
    assert "[sglang-supervisor: line cut, over 16,777,216 bytes]" in r.text and len(r.content) < 2 << 20
    assert "a line before the giant one" not in r.text
    livez_held(w)
    livez = httpx.get(f"{api}/livez", timeout=10).json()
    assert livez["ok"] and livez["loop_heartbeat_age_s"] < 30


def test_followers_that_stall_during_a_flood_then_go_do_not_balloon_the_daemon(running) -> None:  # type: ignore[no-untyped-def]
    s, api, proc = running
    log = Path(s.paths.state_dir) / "logs" / "server.log"
    base = hostile.rss_mb(proc.pid)
    t0 = time.monotonic()
    with watch(api, proc.pid) as w:
        with hostile.following(s.api.port, 20, "/logs?follow=true&lines=0", read=lambda now: now - t0 < 1.0) as c:
            time.sleep(max(0.0, 1.5 - (time.monotonic() - t0)))
            hostile.flood_log(log, 200 << 20)
            time.sleep(3)
        time.sleep(5)  # after they went: the daemon must not read the backlog they left
    assert c["streaming"] == 20
    # The daemon's own reader takes the 200 MB burst in (its loop parses what the ring keeps): probes
    # may be slow for that moment, how slow depends on the machine's load. The subject here is what
    # the stalled followers cost: memory, and the daemon answering once they went.
    assert answers_livez(api, 60), "the daemon did not come back to /livez after the flood"
    assert max(w.rss) - base < RSS_GROWTH_MB, f"RSS {base:.0f} MB at rest, {max(w.rss):.0f} MB peak"
    r = httpx.get(f"{api}/status", timeout=10)
    assert r.status_code == 200


def _ready_with_token(sim, tmp_path: Path, secret: str):  # type: ignore[no-untyped-def]
    """A daemon on the simulator whose API wants `secret`, ready (`/readyz` needs no token): its
    settings, API address and process; the caller cleans it up."""
    s = sim("ok", tp=1)
    token = tmp_path / "token"
    token.write_text(secret + "\n")
    token.chmod(0o600)
    s = s.model_copy(update={"api": s.api.model_copy(update={"token_file": str(token)})})
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    deadline = time.monotonic() + 120
    while hostile.readyz_state(api) != "ready":
        if proc.poll() is not None or time.monotonic() >= deadline:
            cleanup(proc, str(s.paths.state_dir))
            raise AssertionError("the daemon never became ready")
        time.sleep(0.5)
    return s, api, proc


def test_a_flood_of_refused_logins_is_throttled_and_leaves_the_launch_records(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 50: 475,701 wrong `POST /ui/login` in 407 s (no throttle) each wrote a journal record and
    rotated the incident and launch records out. Now an address has a few tries, then 429 unchecked;
    refusals are one journal record per address per minute, in a file of their own."""
    s, api, proc = _ready_with_token(sim, tmp_path, hostile.LOGIN_TOKEN)
    try:
        hostile.manual_restart(api, hostile.LOGIN_TOKEN)  # an incident record for the flood to leave alone
        got = hostile.login_flood(api, 6.0)
        assert got["tries"] > 100 and got["other"] == 0, got
        assert got["refused_401"] <= 20, got  # a burst of 10, and the refill: the rest unchecked
        assert got["throttled_429"] == got["tries"] - got["refused_401"]
        bearer = {"Authorization": f"Bearer {hostile.LOGIN_TOKEN}"}
        r = httpx.get(f"{api}/events", params={"event": "page_login_refused"}, headers=bearer, timeout=10)
        assert r.status_code == 200, r.text
        records = r.json()["events"]
        assert 1 <= len(records) <= 2, records  # one a minute for this address
        assert records[0]["count"] == 1 and records[0]["throttled"] == 0
        launches = httpx.get(f"{api}/events", params={"event": "server_launched"}, headers=bearer, timeout=10)
        assert launches.status_code == 200 and len(launches.json()["events"]) == 2, launches.text
        incidents = httpx.get(f"{api}/events", params={"event": "incident"}, headers=bearer, timeout=10)
        assert [x["cause"] for x in incidents.json()["events"]] == ["manual"], incidents.text
        assert "page_login_refused" not in (Path(s.paths.state_dir) / "events.jsonl").read_text()
        # The operator's right token gets in once this address's bucket refills (one try in 6 s).
        answers = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and 303 not in answers:
            answers.append(
                httpx.post(
                    f"{api}/ui/login",
                    content=f"token={hostile.LOGIN_TOKEN}".encode(),
                    headers={"Content-Type": "application/x-www-form-urlencoded"},
                    timeout=10,
                ).status_code
            )
            time.sleep(1.0)
        assert answers[-1] == 303 and set(answers) <= {303, 429}, answers
        assert httpx.get(f"{api}/status", headers=bearer, timeout=10).status_code == 200
        # Coalesced: the right login writes the refusals held since the first record as one record with
        # their count, so a few records stand for every refused try (the flood's and the 429s above).
        r = httpx.get(f"{api}/events", params={"event": "page_login_refused"}, headers=bearer, timeout=10)
        records = r.json()["events"]
        assert len(records) <= 3, records
        assert sum(x["count"] for x in records) == got["tries"] + answers.count(429), (records, got, answers)
        assert sum(x["throttled"] for x in records) == got["throttled_429"] + answers.count(429), records
    finally:
        cleanup(proc, str(s.paths.state_dir))


def test_a_session_cookie_posted_from_another_port_changes_nothing(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 50 without a browser (tests/integration/test_cookie_ports.py has the Chromium walk): the
    page's cookie and CSRF token in the hands of a service on another loopback port stop nothing, relayed
    with its own Host and Origin, sent with another port's Origin or Host; on the API's own origin the
    same cookie and token do open the form (the control)."""
    from bench.hostile_local import COOKIE_TOKEN, cookie_other_port

    s, api, proc = _ready_with_token(sim, tmp_path, COOKIE_TOKEN)
    try:
        got = cookie_other_port(api, s.api.port)
        assert got["logged_in"] == "yes" and got["same_origin_control"] == 200, got
        assert got["state_changing_accepted"] == 0, got
        assert all(int(code) in (401, 403) for code in got["answers"].split("/")), got
        assert got["state_after"] == "ready", got
        bearer = {"Authorization": f"Bearer {COOKIE_TOKEN}"}
        commands = httpx.get(f"{api}/events", params={"event": "command"}, headers=bearer, timeout=10).json()["events"]
        assert not [c for c in commands if c.get("kind") == "stop"], commands
    finally:
        cleanup(proc, str(s.paths.state_dir))
