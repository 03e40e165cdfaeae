"""The leader's client and member table over httpx.MockTransport: concurrency, timeouts, garbage."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from supervisor.config.settings import GroupSettings
from supervisor.group.client import GroupClient
from supervisor.group.credentials import GroupKeys
from supervisor.group.leader import GroupLeader, Timeouts
from supervisor.group.report import to_wire
from supervisor.group.runtime import GroupRuntime
from supervisor.group.signing import NONCE, NonceBook, RequestCheck, node_key, sign_answer
from supervisor.group.verdict import NodeReport

GROUP = GroupSettings(nnodes=3, node_rank=0, members=("h1:8900", "h2:8900"))
ADDRESSES = {1: "h1:8900", 2: "h2:8900"}
TIMEOUTS = Timeouts(report_s=0.5, capture_s=1.0, stop_s=1.0, launch_s=1.0)
SECRET = b"leader-client-test-secret"
KEYS = GroupKeys(0, SECRET, node_key(SECRET, 0))


def node_of(req: httpx.Request) -> int:
    return 1 if req.url.host == "h1" else 2


def answer(
    req: httpx.Request,
    status: int = 200,
    *,
    json: object = None,
    content: bytes | None = None,
    key: bytes | None = None,
    node: int | None = None,
) -> httpx.Response:
    """What a real member does: its answer signed with its own key, bound to the request's nonce."""
    n = node_of(req) if node is None else node
    data = content if content is not None else __import__("json").dumps(json).encode()
    k = key if key is not None else node_key(SECRET, n)
    s = sign_answer(k, n, req.method, req.url.path, req.headers[NONCE], status, data, time.time())
    return httpx.Response(status, content=data, headers={**s.headers(), "content-type": "application/json"})


def report(node: int, state: str = "ready") -> dict[str, object]:
    return to_wire(NodeReport(node, state, "serving", 10 + node, "base", None, "", (), (), 0.1, 1.0))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def leader_with(handler, clock: Clock | None = None) -> GroupLeader:  # type: ignore[no-untyped-def]
    client = GroupClient(ADDRESSES, KEYS, transport=httpx.MockTransport(handler))
    return GroupLeader(GROUP, client, TIMEOUTS, clock or Clock())

    return {1: "h1:8900", 2: "h2:8900"}


async def test_every_member_is_asked_at_once_signed_with_its_own_key_and_no_token() -> None:
    seen: list[tuple[str, str]] = []

    async def handler(req: httpx.Request) -> httpx.Response:
        n = node_of(req)
        check = RequestCheck(lambda k: node_key(SECRET, k), frozenset({n}), 30.0, NonceBook(30.0, time.monotonic))
        verdict = check(req.method, req.url.path, req.content, req.headers, time.time())
        assert not isinstance(verdict, str), verdict  # signed with member n's key
        seen.append((req.url.host, req.headers.get("authorization", "")))
        await asyncio.sleep(0.3)
        return answer(req, json=report(n))

    leader = leader_with(handler)
    t0 = time.monotonic()
    await leader.refresh()
    assert time.monotonic() - t0 < 0.55  # concurrently, not 0.3 s per member
    assert sorted(seen) == [("h1", ""), ("h2", "")]  # the operator's bearer token is never sent
    views = leader.views()
    assert [(v.node, v.reachable, v.report.state if v.report else None) for v in views] == [
        (1, True, "ready"),
        (2, True, "ready"),
    ]


@pytest.mark.integration  # waits out real request timeouts
async def test_a_member_that_times_out_or_answers_garbage_is_unreachable_and_counted() -> None:
    clock = Clock()

    async def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "h1":
            await asyncio.sleep(5)  # past the 0.5 s request timeout
        return answer(req, content=b"not json")

    leader = leader_with(handler, clock)
    await leader.refresh()
    clock.now += 4.0
    await leader.refresh()
    h1, h2 = leader.views()
    assert not h1.reachable and "Timeout" in h1.error and h1.unreachable_s == 4.0
    assert not h2.reachable and "not a JSON object" in h2.error


async def test_a_malformed_report_is_unreachable_not_a_crash() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return answer(req, json={"node": "one", "state": 3})

    leader = leader_with(handler)
    await leader.refresh()
    assert all(not v.reachable and "malformed report" in v.error for v in leader.views())


async def test_a_stale_poll_after_a_group_stop_is_dropped() -> None:
    release = asyncio.Event()

    async def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/group/report":
            await release.wait()
            return answer(req, json={**report(1), "cause": "rank_died", "state": "hung"})
        return answer(req, json={"node": 1, "state": "stopped", "message": "stopped"})

    leader = leader_with(handler)
    poll = asyncio.ensure_future(leader.refresh())
    await asyncio.sleep(0.05)
    answers = await leader.stop_all()
    release.set()
    await poll
    assert all(a.ok for a in answers)
    assert all(v.report is None for v in leader.views())  # the old servers' verdict is gone


async def test_capture_stop_launch_send_what_the_member_api_takes() -> None:
    bodies: list[tuple[str, dict[str, object]]] = []

    async def handler(req: httpx.Request) -> httpx.Response:
        bodies.append((req.url.path, json.loads(req.content or b"{}")))
        return answer(req, 200 if req.url.path != "/group/launch" else 202, json={"bundle_id": "X"})

    leader = leader_with(handler)
    assert all(a.ok for a in await leader.capture_all("X"))
    await leader.stop_all()
    await leader.launch_all("safe")
    assert ("/group/capture", {"incident": "X"}) in bodies
    assert ("/group/stop", {"timeout_s": 1.0}) in bodies
    assert ("/group/launch", {"rung": "safe"}) in bodies


async def test_refused_connection_is_an_answer_not_an_exception() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    leader = leader_with(handler)
    answers = await leader.capture_all("X")
    assert [a.ok for a in answers] == [False, False] and "ConnectError" in answers[0].error


def test_bundle_doc_names_this_node_and_links_the_others() -> None:
    worker = GroupRuntime(
        GroupSettings(nnodes=3, node_rank=2, leader="h0:8900", members=("h1:8900", "h2:8900")), None, KEYS
    )
    doc = worker.bundle_doc("ID")
    assert doc["node"] == 2 and doc["role"] == "worker"
    assert doc["nodes"] == [
        {"node": 0, "address": "h0:8900", "bundle": "ID"},
        {"node": 1, "address": "h1:8900", "bundle": "ID"},
    ]


async def test_a_forged_answer_is_never_read() -> None:
    """Issue 33: whatever answers at a member's address is believed only when that member's key
    signed it for this request: unsigned, another key, another node's, another request's nonce."""
    forged = {**report(1), "state": "hung", "cause": "rank_died"}
    other = node_key(b"another-groups-secret", 1)
    cases = {
        "unsigned": lambda req: httpx.Response(200, json=forged),
        "wrong key": lambda req: answer(req, json=forged, key=other),
        "node 2's key": lambda req: answer(req, json=forged, node=2),
        "old nonce": lambda req: httpx.Response(
            200,
            content=b"{}",
            headers=sign_answer(
                node_key(SECRET, 1), 1, "GET", "/group/report", "0" * 32, 200, b"{}", time.time()
            ).headers(),
        ),
    }
    for what, make in cases.items():
        leader = leader_with(lambda req, make=make: make(req) if node_of(req) == 1 else answer(req, json=report(2)))
        await leader.refresh()
        h1, h2 = leader.views()
        assert not h1.reachable and h1.report is None, what
        assert "answer" in h1.error, (what, h1.error)
        assert h2.reachable and h2.report is not None


async def test_a_report_speaks_only_for_the_node_that_signed_it() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:  # node 1, correctly signed, reports for node 2
        if node_of(req) == 1:
            return answer(req, json={**report(2), "state": "hung", "cause": "rank_died"})
        return answer(req, json=report(2))

    leader = leader_with(handler)
    await leader.refresh()
    h1, h2 = leader.views()
    assert not h1.reachable and "signed by node 1" in h1.error and h1.report is None
    assert h2.report is not None and h2.report.cause is None


async def test_an_answer_over_the_cap_is_cut_off_and_refused() -> None:
    async def huge() -> object:
        chunk = b"x" * 65536
        for _ in range(1 << 14):  # 1 GiB if it were all read
            yield chunk

    async def handler(req: httpx.Request) -> httpx.Response:
        if node_of(req) == 1:
            return httpx.Response(200, content=huge())
        return answer(req, json=report(2))

    leader = leader_with(handler)
    await leader.refresh()
    h1, h2 = leader.views()
    assert not h1.reachable and "over 1048576 bytes" in h1.error
    assert h2.reachable


async def test_a_stale_poll_across_one_members_relaunch_is_dropped() -> None:
    """A member relaunched on the group's rung (group_mismatch): a report taken before its stop and
    read after must not speak for its new server (a held verdict there would be a second incident)."""
    release = asyncio.Event()

    async def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/group/report":
            await release.wait()
            return answer(req, json={**report(node_of(req)), "cause": "rank_died", "state": "hung"})
        return answer(req, json={"node": 1, "state": "stopped", "message": "done"})

    leader = leader_with(handler)
    poll = asyncio.ensure_future(leader.refresh())
    await asyncio.sleep(0.05)
    stop, launch = await leader.relaunch_one(1, "base")
    release.set()
    await poll
    assert stop.ok and launch is not None and launch.ok
    assert leader.views()[0].report is None  # no old verdict for the relaunched member


async def test_a_member_gone_for_unreachable_s_is_asked_to_capture_and_stop_briefly() -> None:
    """Issue 54: a partitioned member held the group's evidence 70 s (its capture's timeout) before
    the group could relaunch. One that has not answered for `unreachable_s` is asked with the
    report's timeout; one that answers is given the step's whole timeout."""
    clock = Clock()
    asked: list[tuple[str, str]] = []

    async def handler(req: httpx.Request) -> httpx.Response:
        asked.append((req.url.host, req.url.path))
        if req.url.host == "h1":
            await asyncio.sleep(60)  # partitioned: nothing comes back
        if req.url.path == "/group/report":
            return answer(req, json=report(2))
        return answer(req, json={"bundle_id": "x", "stopped": True})

    client = GroupClient(ADDRESSES, KEYS, transport=httpx.MockTransport(handler))
    leader = GroupLeader(GROUP, client, Timeouts(report_s=0.2, capture_s=30.0, stop_s=30.0, launch_s=30.0), clock)
    await leader.refresh()
    clock.now += GROUP.unreachable_s
    await leader.refresh()
    t0 = time.monotonic()
    captured = await leader.capture_all("i1")
    stopped = await leader.stop_all()
    assert time.monotonic() - t0 < 15.0  # not the 30 s step timeouts
    assert [(a.node, a.ok) for a in captured] == [(1, False), (2, True)]
    assert [(a.node, a.ok) for a in stopped] == [(1, False), (2, True)]
    assert ("h2", "/group/capture") in asked and ("h1", "/group/capture") in asked  # still asked
