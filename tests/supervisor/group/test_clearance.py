"""A worker's clearance to launch (supervisor/group/members.py): it launches only once its leader
has accepted this daemon and named the rung, whoever asked for the launch (issue 34)."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any

from supervisor.config.settings import GroupSettings, Settings, settings_from_mapping
from supervisor.group.client import Answer
from supervisor.group.credentials import GroupKeys
from supervisor.group.members import GroupPeers, read_join
from supervisor.group.runtime import GroupRuntime

KEYS = GroupKeys(1, None, b"k" * 32)
LEADER = "h0:8900"
REFUSED = Answer(0, LEADER, False, 409, {"error": "refused", "detail": "tp-size (leader 2, this node 4)"})
AWAY = Answer(0, LEADER, False, None, error="ConnectError: refused")


def ok(verdict: str, rung: str | None = None) -> Answer:
    return Answer(0, LEADER, True, 200, {"verdict": verdict, "rung": rung, "reason": f"the leader says {verdict}"})


def test_only_launch_and_wait_accept_this_daemon_and_the_rung_is_always_the_leaders() -> None:
    table: list[tuple[Answer, bool, str | None, bool | None]] = [
        # answer, by_group (the leader's own launch request, naming "base") -> rung launched, accepted
        (ok("launch", "second"), False, "second", True),
        (ok("launch", "second"), True, "base", True),  # the request's rung: the leader named it there
        (ok("wait"), False, None, True),
        (ok("wait"), True, "base", True),  # the leader is mid-launch of the group it asked this node into
        (REFUSED, False, None, False),
        (REFUSED, True, None, False),
        (AWAY, False, None, None),
        (AWAY, True, None, None),
        (ok("launch"), False, None, True),  # no rung named: nothing to launch yet
        (ok("maybe", "base"), True, None, None),  # not an answer the leader gives
    ]
    for a, by_group, rung, accepted in table:
        r = read_join(a, "base", by_group)
        assert (r.clearance.rung, r.accepted) == (rung, accepted), (a, by_group)
    refused = read_join(REFUSED, "base", True).clearance.why
    assert refused == "refused by the group's leader: tp-size (leader 2, this node 4)"
    assert "cannot be asked (ConnectError: refused)" in read_join(AWAY, "base", True).clearance.why


class Leader:
    """The worker's client for its leader: answers in order, and counts the asks."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.asked: list[Mapping[str, Any]] = []

    async def ask_all(self, method: str, path: str, *, timeout: float, body: Mapping[str, Any]) -> tuple[Answer, ...]:
        assert (method, path) == ("POST", "/group/join")
        self.asked.append(body)
        return (self.answers.pop(0),)


async def beating(work: Awaitable[Any]) -> Any:
    return await work


def worker(tmp_path: Path, tp: int = 2) -> Settings:
    secret = tmp_path / "secret"
    secret.write_text("clearance-test-secret-0123\n")
    secret.chmod(0o600)
    data = {
        "server": {"command": ["sglang"], "args": {"tp-size": tp, "nnodes": 2, "node-rank": 1}},
        "group": {"nnodes": 2, "node_rank": 1, "leader": LEADER, "secret_file": str(secret)},
        "paths": {"state_dir": str(tmp_path / "state")},
    }
    return settings_from_mapping(data)


async def test_the_leaders_launch_request_does_not_launch_a_daemon_it_has_not_accepted(tmp_path: Path) -> None:
    leader = Leader(REFUSED, REFUSED, ok("launch", "base"), ok("wait"))
    g = GroupRuntime(GroupSettings(nnodes=2, node_rank=1, leader=LEADER), None, KEYS)
    g.to_leader = leader  # type: ignore[assignment]
    peers = GroupPeers(g)
    peers.attach(lambda *a, **kw: None, beating)
    s = worker(tmp_path)
    peers.fit(s)
    # Refused at its start-up ask; then the leader's group launch reaches it: it asks again, holds.
    assert (await peers.clearance("base", False)).rung is None
    held = await peers.clearance("base", True)
    assert held.rung is None and "tp-size (leader 2, this node 4)" in held.why and len(leader.asked) == 2
    # Accepted (its config fixed on the leader's side): the leader's later launches need no ask.
    assert (await peers.clearance("base", False)).rung == "base"
    assert (await peers.clearance("second", True)).rung == "second" and len(leader.asked) == 3
    # A reload that changes its config: the leader accepted the old one, so it asks again.
    peers.fit(worker(tmp_path, tp=4))
    assert (await peers.clearance("base", True)).rung == "base" and len(leader.asked) == 4
    assert leader.asked[-1]["fingerprint"]["tp-size"] == "4"
    peers.fit(worker(tmp_path, tp=4))  # the same config again: still accepted
    assert (await peers.clearance("base", True)).rung == "base" and len(leader.asked) == 4
