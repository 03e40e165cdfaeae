"""Each route's answers: success bodies, and the right 4xx for each kind of bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fake_supervisor import SAMPLE_LADDER, FakeSupervisor, sample_snapshot
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from supervisor.status.commands import Command, CommandResult
from supervisor.status.journal import Journal

AppFactory = Callable[..., FastAPI]
ClientFactory = Callable[..., httpx.AsyncClient]


async def test_status_is_the_snapshot(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    r = await client.get("/status")
    assert r.status_code == 200
    body = r.json()
    assert body == handle.snap.model_dump(mode="json")
    for key in ("state", "phase", "progress", "rung", "pid", "restarts", "last_progress_s", "last_incident"):
        assert key in body
    assert set(body["last_incident"]) >= {"id", "cause", "hang_class", "at"}


async def test_restart_accepted_then_conflict(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    r = await client.post("/restart", json={"rung": "no-cuda-graph", "reason": "test", "diagnose": True})
    assert r.status_code == 202
    assert r.json() == {"incident_id": "inc-manual-1", "state": "restarting", "message": ""}
    cmd = handle.submitted[-1]
    assert (cmd.kind, cmd.rung, cmd.reason, cmd.diagnose) == ("restart", "no-cuda-graph", "test", True)

    r = await client.post("/restart", json={})
    assert r.status_code == 409
    assert r.json()["state"] == "restarting"
    assert r.json()["error"] == "conflict"


async def test_restart_without_a_body(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    r = await client.post("/restart")
    assert r.status_code == 202
    assert handle.submitted[-1].rung is None


async def test_unknown_rung_names_the_ladder(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    r = await client.post("/restart", json={"rung": "no-such-rung"})
    assert r.status_code == 404
    body = r.json()
    assert body["error"] == "unknown_rung"
    assert body["rungs"] == list(SAMPLE_LADDER)
    assert "no-cuda-graph" in body["detail"]
    assert handle.submitted == []  # refused before it reached the queue


async def test_unknown_rung_from_the_supervisor(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    handle.snap = handle.snap.model_copy(update={"ladder": ()})  # no ladder published yet
    r = await client.post("/restart", json={"rung": "nope"})
    assert r.status_code == 404
    assert r.json()["error"] == "unknown_rung"
    assert "nope" in r.json()["detail"]
    assert "not loaded" in r.json()["detail"]


async def test_failed_command_is_503_not_500(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    handle.fail_next = "release not verified: GPU memory still held"
    r = await client.post("/stop")
    assert r.status_code == 503
    assert r.json()["error"] == "failed"
    assert "GPU memory" in r.json()["detail"]


async def test_stop_then_start(client: httpx.AsyncClient) -> None:
    r = await client.post("/stop")
    assert (r.status_code, r.json()["state"]) == (202, "stopped")
    r = await client.post("/stop")  # stopping a stopped server is done already, not a conflict
    assert (r.status_code, r.json()["state"], r.json()["message"]) == (202, "stopped", "already stopped")
    r = await client.post("/start")
    assert (r.status_code, r.json()["state"]) == (202, "starting")
    r = await client.post("/start")  # starting a running server is done already too (issue 53)
    assert (r.status_code, r.json()["message"]) == (202, "already running (state starting)")
    assert (await client.post("/start", json={"rung": "base"})).status_code == 409  # not what runs: restart --rung


async def test_diagnose_returns_bundle(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    r = await client.post("/diagnose", json={"native": True, "gdb": False})
    assert r.status_code == 200
    assert r.json()["bundle_id"] == "b-manual"
    assert r.json()["summary"] == {"hang_class": "unknown"}
    assert (handle.submitted[-1].native, handle.submitted[-1].gdb) == (True, False)


async def test_diagnose_while_diagnosing_is_429(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    handle.hold_capture = True
    first = asyncio.create_task(client.post("/diagnose", json={}))
    await asyncio.wait_for(handle.capture_started.wait(), 5)
    second = await client.post("/diagnose", json={"gdb": True})
    assert second.status_code == 429
    assert second.headers["retry-after"]
    assert second.json()["error"] == "busy"
    handle.release_capture.set()
    assert (await first).status_code == 200


async def test_status_and_metrics_answer_during_a_capture(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    handle.hold_capture = True
    capture = asyncio.create_task(client.post("/diagnose", json={"gdb": True}))
    await asyncio.wait_for(handle.capture_started.wait(), 5)
    # The capture is held until released: a route that waited on it would never answer, so an
    # answer at all (the bound only keeps a failure from hanging the suite) proves it does not.
    for _ in range(20):
        for path in ("/status", "/metrics", "/diagnostics"):
            r = await asyncio.wait_for(client.get(path), 60)
            assert r.status_code == 200
    assert not capture.done()
    handle.release_capture.set()
    assert (await capture).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/restart", b'{"rung": "base",', 400),  # torn JSON
        ("/restart", b"\xff\xfe not utf-8", 400),
        ("/restart", b"[1, 2]", 422),
        ("/restart", b'"base"', 422),
        ("/restart", b'{"diagnose": "yes"}', 422),  # strict: no string booleans
        ("/restart", b'{"diagnose": 1}', 422),
        ("/restart", b'{"rung": 3}', 422),
        ("/restart", b'{"reason": null, "rung": []}', 422),
        ("/restart", b'{"rungg": "base"}', 422),  # unknown field
        ("/diagnose", b'{"native": "true"}', 422),
        ("/diagnose", b'{"gdb": true, "pyspy": true}', 422),
        ("/diagnose", b"{", 400),
    ],
)
async def test_bad_bodies(
    client: httpx.AsyncClient, handle: FakeSupervisor, path: str, body: bytes, status: int
) -> None:
    r = await client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"] in ("malformed_json", "invalid", "bad_request")
    assert r.json()["detail"]
    assert handle.submitted == []


async def test_form_encoded_body_says_to_send_json(client: httpx.AsyncClient) -> None:
    r = await client.post("/restart", content=b'{"rung": "base"}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 422
    assert "application/json" in r.json()["detail"]


async def test_oversized_body_is_413(make_app: AppFactory, make_client: ClientFactory, handle: FakeSupervisor) -> None:
    async with make_client(make_app(max_body_bytes=100)) as c:
        big = json.dumps({"reason": "x" * 500})
        r = await c.post("/restart", content=big, headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert r.json()["error"] == "too_large"

        async def chunks() -> object:  # no Content-Length: counted as it streams
            for _ in range(10):
                yield b" " * 50

        r = await c.post("/restart", content=chunks(), headers={"Content-Type": "application/json"})  # type: ignore[arg-type]
        assert r.status_code == 413
        r = await c.post("/restart", content=b"{}", headers={"Content-Length": "abc"})
        assert r.status_code == 400
        r = await c.post("/restart", json={"reason": "fits"})
        assert r.status_code == 202
    assert len(handle.submitted) == 1


async def test_events_newest_last_with_limit(client: httpx.AsyncClient, journal: Journal) -> None:
    for i in range(5):
        journal.append("incident", n=i)
    r = await client.get("/events", params={"limit": 3})
    assert r.status_code == 200
    assert [e["n"] for e in r.json()["events"]] == [2, 3, 4]
    r = await client.get("/events")
    assert r.json()["events"][0]["event"] == "state_changed"
    for bad in ("0", "1001", "-1", "x", "1.5"):
        assert (await client.get("/events", params={"limit": bad})).status_code == 422


async def test_events_filtered_by_name_and_time(client: httpx.AsyncClient, journal: Journal) -> None:
    for i in range(4):
        journal.append("incident" if i % 2 else "server_ready", n=i)
    r = await client.get("/events", params={"event": "incident"})
    assert [e["n"] for e in r.json()["events"]] == [1, 3]
    r = await client.get("/events", params=[("event", "incident"), ("event", "server_ready"), ("limit", "3")])
    assert [e["n"] for e in r.json()["events"]] == [1, 2, 3]
    assert (await client.get("/events", params={"since": "2999-01-01T00:00:00Z"})).json()["events"] == []
    r = await client.get("/events", params={"since": "2000-01-01T00:00:00+00:00", "event": "server_ready"})
    assert [e["n"] for e in r.json()["events"]] == [0, 2]
    r = await client.get("/events", params={"since": "yesterday"})
    assert r.status_code == 422 and "since" in str(r.json()["detail"])


async def test_stop_and_start_bodies_are_strict(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    assert (await client.post("/stop", json={"reasn": "typo"})).status_code == 422
    assert (await client.post("/stop", json={"reason": "maintenance"})).status_code == 202
    assert handle.submitted[-1].reason == "maintenance"
    r = await client.post("/start", json={"rung": "no-such-rung"})
    assert r.status_code == 404 and r.json()["error"] == "unknown_rung"
    assert (await client.post("/start", json={"rung": "base", "x": 1})).status_code == 422


async def test_reload(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    r = await client.post("/reload")
    assert (r.status_code, r.json()["message"]) == (200, "reloaded")
    assert handle.submitted[-1].kind == "reload"


async def test_metrics_exposition(client: httpx.AsyncClient) -> None:
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert "sglang_supervisor_state" in names


async def test_livez_and_readyz(make_app: AppFactory, make_client: ClientFactory, handle: FakeSupervisor) -> None:
    age = [0.5]
    async with make_client(make_app(liveness=lambda: age[0], liveness_max_age_s=10.0)) as c:
        r = await c.get("/livez")
        assert (r.status_code, r.json()["ok"], r.json()["loop_heartbeat_age_s"]) == (200, True, 0.5)
        age[0] = 42.0
        r = await c.get("/livez")
        assert (r.status_code, r.json()["ok"]) == (503, False)
        assert "42" in r.json()["detail"]

        assert (await c.get("/readyz")).json() == {"ready": True, "state": "ready"}
        handle.snap = sample_snapshot(state="degraded")
        assert (await c.get("/readyz")).status_code == 200
        handle.snap = sample_snapshot(state="hung")
        r = await c.get("/readyz")
        assert (r.status_code, r.json()) == (503, {"ready": False, "state": "hung"})


async def test_livez_without_heartbeat(client: httpx.AsyncClient) -> None:
    r = await client.get("/livez")
    assert (r.status_code, r.json()["ok"]) == (200, True)


async def test_a_bug_is_a_logged_503_not_a_500(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    def broken() -> None:
        raise RuntimeError("snapshot exploded")

    handle.snapshot = broken  # type: ignore[assignment,method-assign]
    r = await client.get("/status")
    assert r.status_code == 503
    assert r.json() == {"error": "internal", "detail": "RuntimeError: snapshot exploded"}


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    r = await client.get("/nope")
    assert (r.status_code, r.json()["error"]) == (404, "not_found")
    r = await client.get("/restart")
    assert (r.status_code, r.json()["error"]) == (405, "method_not_allowed")


async def test_openapi_lists_every_route(client: httpx.AsyncClient, tmp_path: Path) -> None:
    r = await client.get("/openapi.json")
    paths = set(r.json()["paths"])
    assert paths == {
        "/status",
        "/ui",
        "/restart",
        "/diagnose",
        "/stop",
        "/start",
        "/reload",
        "/promote",
        "/diagnostics",
        "/diagnostics/{bundle_id}",
        "/diagnostics/{bundle_id}/{name}",
        "/events",
        "/metrics",
        "/livez",
        "/readyz",
    }
    assert (await client.get("/docs")).status_code == 404  # no CDN-backed interactive docs (docs/API.md)


async def test_api_doc_covers_every_route(client: httpx.AsyncClient) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "API.md").read_text()
    schema = (await client.get("/openapi.json")).json()
    for path, ops in schema["paths"].items():
        documented = path.replace("{bundle_id}", "{id}").replace("{name}", "{file}")
        for method in ops:
            assert f"`{method.upper()} {documented}" in doc, (method, path)


async def test_other_refusals_are_400_with_the_reason(client: httpx.AsyncClient, handle: FakeSupervisor) -> None:
    async def refuse(command: Command) -> CommandResult:
        return CommandResult("invalid", "the server is stopped: use POST /start")

    handle.submit = refuse  # type: ignore[method-assign]
    r = await client.post("/restart", json={"rung": "no-spec"})  # a real rung: not an unknown-rung 404
    assert (r.status_code, r.json()["error"]) == (400, "invalid")
    assert r.json()["state"] == "ready"  # from the snapshot when the result has none
    assert "POST /start" in r.json()["detail"]


async def test_accepted_without_state_reports_the_snapshot_state(
    client: httpx.AsyncClient, handle: FakeSupervisor
) -> None:
    async def accept(command: Command) -> CommandResult:
        return CommandResult("accepted")

    handle.submit = accept  # type: ignore[method-assign]
    r = await client.post("/stop")
    assert r.status_code == 202
    assert r.json()["state"] == "ready"
