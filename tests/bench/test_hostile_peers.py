"""The hostile benchmark's peer attacks are wired (`--only` takes them, each runs against a leader
whose member address is the benchmark's fake, the fake forges, floods and relays as the rows say),
and `--only` keeps the other rows of the published section and its text; no daemon is started."""

from __future__ import annotations

import importlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest


@pytest.fixture
def peers(hostile: ModuleType) -> ModuleType:
    return importlib.import_module("bench.hostile_peers")


def test_the_peer_attacks_are_attacks_that_only_selects(hostile: ModuleType, peers: ModuleType) -> None:
    assert peers.PEER_ATTACKS == ("peer_forged_report", "peer_giant_answer")
    assert set(peers.PEER_ATTACKS) <= set(hostile.ATTACKS) and set(peers.MODES) == set(peers.PEER_ATTACKS)
    assert hostile.ATTACKS[: len(hostile.API_ATTACKS)] == hostile.API_ATTACKS


def test_the_leader_polls_the_fake_with_a_token_and_the_group_key(peers: ModuleType, tmp_path: Path) -> None:
    base, worker, token_file = peers.leader_config(tmp_path)
    leader = peers.with_member(base, "127.0.0.1:1", token_file)
    g = leader.settings.group
    assert g is not None and g.nnodes == 2 and g.node_rank == 0 and tuple(g.members) == ("127.0.0.1:1",)
    assert g.secret_file and Path(g.secret_file).exists()
    assert leader.settings.api.token_file == str(token_file) and token_file.stat().st_mode & 0o077 == 0
    assert token_file.read_text().strip() == peers.TOKEN
    assert "127.0.0.1:1" in leader.config.read_text()  # the config the daemon will run with
    wg = worker.settings.group
    assert wg is not None and wg.node_rank == 1 and wg.secret_file == g.secret_file


class _Member(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps({"node": 1, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("x-group-signature", "cd" * 32)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_the_fake_relays_forges_floods_and_sees_the_token(peers: ModuleType) -> None:
    member = ThreadingHTTPServer(("127.0.0.1", 0), _Member)
    threading.Thread(target=member.serve_forever, daemon=True).start()
    fake = peers.FakeMember(f"http://127.0.0.1:{member.server_address[1]}", peers.TOKEN)
    url = f"http://{fake.address}/group/report"
    try:
        r = httpx.get(url, headers={"x-group-node": "1"}, timeout=5, trust_env=False)  # relay: node 1's own answer
        assert r.json() == {"node": 1, "path": "/group/report"} and r.headers["x-group-signature"] == "cd" * 32
        assert fake.token_seen == 0 and fake.authorization_seen == 0
        fake.mode = "forge"
        r = httpx.get(url, timeout=5, trust_env=False)
        assert r.json()["cause"] == "rank_died" and len(r.headers["x-group-signature"]) == 64
        fake.mode = "flood"
        read = 0
        with httpx.stream("GET", url, timeout=5, trust_env=False) as s:
            for chunk in s.iter_raw():
                read += len(chunk)
                if read >= 2 << 20:
                    break  # hang up, as the leader does at its cap
        assert fake.requests == {"relay": 1, "forge": 1, "flood": 1}
        # The fake's thread counts a chunk once its write returns: the client can have read it first.
        deadline = time.monotonic() + 5
        while fake.sent["flood"] < 2 << 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 2 << 20 <= fake.sent["flood"] < peers.GIANT
        fake.mode = "relay"
        httpx.get(url, headers={"Authorization": f"Bearer {peers.TOKEN}"}, timeout=5, trust_env=False)
        assert fake.token_seen == 1 and fake.authorization_seen == 1
    finally:
        fake.close()
        member.shutdown()
        member.server_close()


def _summary(rss: float) -> dict[str, Any]:
    return {
        "livez_ok": 10, "livez_failed": 0, "livez_p50_ms": 5.0, "livez_p99_ms": 9.0,
        "rss_peak_mb": rss, "fds_peak": 12, "failures": [],
    }  # fmt: skip


SECTION = """<!-- section:hostile -->
## Hostile clients: the API against clients that send and never read

Measured 2026-12-02 16:39 UTC on Box, 2 cores, 24 GiB; Linux; Python 3.11.7 (branch x).
Reproduce: `.venv/bin/python -m bench.hostile`.

Intro.

| attack | RSS MB | fds | at rest | under attack | /livez failed | what the attack got |
|------------------|---|---|---|---|---|---|
| metrics_pipeline | 70 / 125 / 125 | 12 / 275 / 13 | 1 / 2 | 3 / 4 | 0 of 33 | opened 780 |
| giant_line       | 113 / 114 / 114 | 12 / 18 / 13 | 1 / 2 | 3 / 4 | 0 of 2 | answered 8 |

Output written while the daemon and its log keeper are both gone (both SIGKILLed): 0 of 200 lines.

Reading the table: by hand.
<!-- /section:hostile -->
"""


def test_only_runs_the_peer_attacks_and_keeps_the_other_rows_and_the_text(
    hostile: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import bench.common
    import bench.hostile_peers

    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n\n" + SECTION)
    ran: list[tuple[str, float]] = []

    def fake_attack(name: str, seconds: float, watch: object) -> dict[str, Any]:
        assert watch is hostile.Watch
        ran.append((name, seconds))
        extra = {"polls": 7, "served": "7 MB", "incidents": 0, "token_seen": "no"}
        return {
            "attack": name,
            "rest": _summary(70),
            "attack_figures": _summary(90),
            "after": _summary(71),
            "extra": extra,
        }

    published: dict[str, str] = {}
    monkeypatch.setattr(bench.hostile_peers, "run_peer_attack", fake_attack)
    monkeypatch.setattr(bench.common, "save_result", lambda name, data: None)
    monkeypatch.setattr(bench.common, "publish", lambda part, body: published.setdefault(part, body))
    monkeypatch.setattr(hostile, "REPORT", report)
    monkeypatch.setattr(hostile, "output_gap", lambda: pytest.fail("the output gap was not asked for"))
    assert hostile.main(["--only", "peer_giant_answer", "--only", "peer_forged_report", "--seconds", "2"]) == 0
    assert ran == [("peer_forged_report", 2.0), ("peer_giant_answer", 2.0)]  # ATTACKS' order
    body = published["hostile"]
    rows = [line.split("|")[1].strip() for line in body.splitlines() if line.startswith("| ")][1:]
    assert rows == ["metrics_pipeline", "giant_line", "peer_forged_report", "peer_giant_answer"]
    assert "| 113 / 114 / 114" in body.replace("| 113 / 114 / 114 ", "| 113 / 114 / 114")  # kept as written
    assert "70 / 90 / 71" in body and "polls 7, served 7 MB, incidents 0, token_seen no" in body
    assert (
        "Rows kept from an earlier run (`--only`), measured 2026-12-02 16:39 UTC on Box, 2 cores, 24 GiB: "
        "metrics_pipeline, giant_line, output_gap." in body
    )
    assert "0 of 200 lines." in body and body.rstrip().endswith("Reading the table: by hand.")
    # once published, a later `--only` still knows when the kept rows were measured
    kept = hostile.published(_written(report, body))
    assert kept.rows["giant_line"][1] == "2026-12-02 16:39 UTC on Box, 2 cores, 24 GiB"
    assert kept.rows["peer_forged_report"][1] != kept.rows["giant_line"][1]
    assert kept.gap.startswith(hostile.GAP_PARAGRAPH) and kept.prose == "Reading the table: by hand."


def _written(report: Path, body: str) -> Path:
    from bench.report import write_section

    write_section("hostile", body, report)
    return report
