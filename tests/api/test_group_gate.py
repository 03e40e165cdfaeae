"""The member API's gate (api/groupgate.py): only requests signed with this node's key reach the
group routes, whatever the bearer-token app would allow, and every answer is signed."""

from __future__ import annotations

import json
import time

import httpx
from groupfake import FakeDaemon

from api.groupgate import MEMBER_PATHS, GroupGate, group_app
from supervisor.group.signing import NONCE, NonceBook, RequestCheck, check_answer, node_key, sign_request

SECRET = b"gate-test-secret-0123456789"
KEY = node_key(SECRET, 1)


async def main_app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    """The operator's app stands in: anything that reaches it says so."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"main app"})


def gate(fake: FakeDaemon, wall: float | None = None) -> httpx.AsyncClient:
    check = RequestCheck(lambda n: node_key(SECRET, n), frozenset({1}), 30.0, NonceBook(30.0, time.monotonic))
    app = GroupGate(
        main_app, group_app(fake), check, wall=lambda: wall or time.time(), max_body_bytes=65536, paths=MEMBER_PATHS
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def signed(method: str, path: str, body: bytes = b"", *, key: bytes = KEY, node: int = 1, at: float | None = None):  # type: ignore[no-untyped-def]
    s = sign_request(key, node, method, path, body, at if at is not None else time.time())
    return s, {**s.headers(), "content-type": "application/json"}


async def test_anonymous_and_bearer_requests_are_refused_401_and_nothing_is_submitted() -> None:
    fake = FakeDaemon()
    async with gate(fake) as c:
        r = await c.post("/group/stop", json={})
        assert r.status_code == 401 and "not signed" in r.json()["detail"]
        r = await c.post("/group/stop", json={}, headers={"Authorization": "Bearer anything"})
        assert r.status_code == 401
        assert (await c.get("/status")).text == "main app"  # other paths are the operator's app's
    assert fake.submitted == []


async def test_a_signed_request_is_answered_and_the_answer_is_signed_for_it() -> None:
    fake = FakeDaemon()
    async with gate(fake) as c:
        s, headers = signed("GET", "/group/report")
        r = await c.get("/group/report", headers=headers)
    assert r.status_code == 200 and r.json()["node"] == 1
    why = check_answer(KEY, 1, "GET", "/group/report", s.nonce, 200, r.content, r.headers, time.time(), 30.0)
    assert why == ""
    assert check_answer(KEY, 1, "GET", "/group/report", "0" * 32, 200, r.content, r.headers, time.time(), 30.0)


async def test_replayed_stale_foreign_and_tampered_requests_are_refused() -> None:
    fake = FakeDaemon()
    body = json.dumps({"rung": "base"}).encode()
    async with gate(fake) as c:
        _, headers = signed("POST", "/group/launch", body)
        assert (await c.post("/group/launch", content=body, headers=headers)).status_code == 202
        r = await c.post("/group/launch", content=body, headers=headers)  # the same nonce again
        assert r.status_code == 401 and "replayed" in r.text
        _, old = signed("POST", "/group/launch", body, at=time.time() - 120)
        r = await c.post("/group/launch", content=body, headers=old)
        assert r.status_code == 401 and "stale" in r.text
        _, other = signed("POST", "/group/launch", body, key=node_key(b"not-this-groups-secret", 1))
        assert (await c.post("/group/launch", content=body, headers=other)).status_code == 401
        _, node2 = signed("POST", "/group/launch", body, key=node_key(SECRET, 2), node=2)
        r = await c.post("/group/launch", content=body, headers=node2)
        assert r.status_code == 401 and "signed as node 2" in r.text
        _, join = signed("POST", "/group/join", b"{}")
        r = await c.post("/group/join", content=b"{}", headers=join)
        assert r.status_code == 404  # a member answers the leader's routes only
        _, tampered = signed("POST", "/group/launch", body)
        r = await c.post("/group/launch", content=json.dumps({"rung": "safe"}).encode(), headers=tampered)
        assert r.status_code == 401 and "does not verify" in r.text
    assert [c.rung for c in fake.submitted] == ["base"]  # only the first, genuine request
    assert NONCE  # the header names are the contract: docs/MULTINODE.md
