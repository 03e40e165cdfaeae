"""The leader's client and member table over httpx.MockTransport: concurrency, timeouts, garbage."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from supervisor.config.settings import GroupSettings
from supervisor.group.client import GroupClient
from supervisor.group.leader import GroupLeader, Timeouts
from supervisor.group.report import to_wire
from supervisor.group.runtime import GroupRuntime
from supervisor.policy.group import NodeReport

GROUP = GroupSettings(nnodes=3, node_rank=0, members=("h1:8900", "h2:8900"))
ADDRESSES = {1: "h1:8900", 2: "h2:8900"}
TIMEOUTS = Timeouts(report_s=0.5, capture_s=1.0, stop_s=1.0, launch_s=1.0)


def report(node: int, state: str = "ready") -> dict[str, object]:
    return to_wire(NodeReport(node, state, "serving", 10 + node, "base", None, "", (), (), 0.1, 1.0))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def leader_with(handler, clock: Clock | None = None) -> GroupLeader:  # type: ignore[no-untyped-def]
    client = GroupClient(ADDRESSES, "tok", transport=httpx.MockTransport(handler))
    return GroupLeader(GROUP, client, TIMEOUTS, clock or Clock())

    return {1: "h1:8900", 2: "h2:8900"}


async def test_every_member_is_asked_at_once_with_the_token() -> None:
    seen: list[tuple[str, str]] = []

    async def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.url.host, req.headers.get("authorization", "")))
        await asyncio.sleep(0.3)
        return httpx.Response(200, json=report(1 if req.url.host == "h1" else 2))

    leader = leader_with(handler)
    t0 = time.monotonic()
    await leader.refresh()
    assert time.monotonic() - t0 < 0.55  # concurrently, not 0.3 s per member
    assert sorted(seen) == [("h1", "Bearer tok"), ("h2", "Bearer tok")]
    views = leader.views()
    assert [(v.node, v.reachable, v.report.state if v.report else None) for v in views] == [
        (1, True, "ready"),
        (2, True, "ready"),
    ]


async def test_a_member_that_times_out_or_answers_garbage_is_unreachable_and_counted() -> None:
    clock = Clock()

    async def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "h1":
            await asyncio.sleep(5)  # past the 0.5 s request timeout
        return httpx.Response(200, content=b"not json")

    leader = leader_with(handler, clock)
    await leader.refresh()
    clock.now += 4.0
    await leader.refresh()
    h1, h2 = leader.views()
    assert not h1.reachable and "Timeout" in h1.error and h1.unreachable_s == 4.0
    assert not h2.reachable and "not a JSON object" in h2.error


async def test_a_malformed_report_is_unreachable_not_a_crash() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"node": "one", "state": 3})

    leader = leader_with(handler)
    await leader.refresh()
    assert all(not v.reachable and "malformed report" in v.error for v in leader.views())


async def test_a_stale_poll_after_a_group_stop_is_dropped() -> None:
    release = asyncio.Event()

    async def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/group/report":
            await release.wait()
            return httpx.Response(200, json={**report(1), "cause": "rank_died", "state": "hung"})
        return httpx.Response(200, json={"node": 1, "state": "stopped", "message": "stopped"})

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
        return httpx.Response(200 if req.url.path != "/group/launch" else 202, json={"bundle_id": "X"})

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
    worker = GroupRuntime(GroupSettings(nnodes=3, node_rank=2, leader="h0:8900", members=("h1:8900", "h2:8900")), None)
    doc = worker.bundle_doc("ID")
    assert doc["node"] == 2 and doc["role"] == "worker"
    assert doc["nodes"] == [
        {"node": 0, "address": "h0:8900", "bundle": "ID"},
        {"node": 1, "address": "h1:8900", "bundle": "ID"},
    ]
