"""The group's member API (api/group.py) over a tiny fake daemon: what each route submits and answers."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from groupfake import FakeDaemon

from api import group
from api.errors import http_exception_handler, validation_exception_handler
from supervisor.group.report import from_wire
from supervisor.status.commands import CommandResult


def app_for(fake: FakeDaemon) -> FastAPI:
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    app = FastAPI()
    app.add_exception_handler(HTTPException, http_exception_handler)
    app.add_exception_handler(RequestValidationError, validation_exception_handler)
    app.state.group = fake
    app.include_router(group.router)
    return app


def client(fake: FakeDaemon) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app_for(fake)), base_url="http://test")


async def test_report_round_trips_through_the_wire() -> None:
    async with client(FakeDaemon()) as c:
        r = await c.get("/group/report")
    assert r.status_code == 200
    rep = from_wire(r.json())
    assert rep.node == 1 and rep.ranks[0].status == "stopped"


async def test_capture_submits_a_diagnose_under_the_leaders_id() -> None:
    fake = FakeDaemon(
        results={"diagnose": CommandResult("done", "captured", "hung", bundle_id="20261201T170000Z-rank_died")}
    )
    async with client(fake) as c:
        r = await c.post("/group/capture", json={"incident": "20261201T170000Z-rank_died"})
    assert r.status_code == 200, r.text
    assert r.json()["bundle_id"] == "20261201T170000Z-rank_died" and r.json()["node"] == 1
    cmd = fake.submitted[0]
    assert (cmd.kind, cmd.incident_id, cmd.source) == ("diagnose", "20261201T170000Z-rank_died", "group")


@pytest.mark.parametrize("incident", ["../etc", "a/b", "", ".hidden", "x" * 200])
async def test_capture_refuses_an_id_that_is_not_a_directory_name(incident: str) -> None:
    fake = FakeDaemon()
    async with client(fake) as c:
        r = await c.post("/group/capture", json={"incident": incident})
    assert r.status_code == 422 and not fake.submitted


async def test_capture_refused_by_the_daemon_is_a_4xx_with_the_reason() -> None:
    fake = FakeDaemon(
        results={"diagnose": CommandResult("invalid", "no server to diagnose (state stopped)", "stopped")}
    )
    async with client(fake) as c:
        r = await c.post("/group/capture", json={"incident": "abc"})
    assert r.status_code == 400 and "no server" in r.text


async def test_stop_answers_once_stopped_with_the_verification() -> None:
    fake = FakeDaemon(stops_after=3)
    async with client(fake) as c:
        r = await c.post("/group/stop", json={"timeout_s": 10})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "stopped" and r.json()["last_stop"]["port_free"] is True
    assert fake.submitted[0].kind == "stop" and fake.submitted[0].source == "group"


async def test_stop_that_never_ends_is_a_504() -> None:
    fake = FakeDaemon()  # never shows `stopped`
    async with client(fake) as c:
        r = await c.post("/group/stop", json={"timeout_s": 0.3})
    assert r.status_code == 504


async def test_launch_takes_a_rung_of_the_ladder() -> None:
    fake = FakeDaemon(state="stopped")
    async with client(fake) as c:
        r = await c.post("/group/launch", json={"rung": "safe"})
        bad = await c.post("/group/launch", json={"rung": "nope"})
        empty = await c.post("/group/launch", json={})
    assert r.status_code == 202 and fake.submitted[0].rung == "safe" and fake.submitted[0].kind == "start"
    assert bad.status_code == 404 and empty.status_code == 422
    assert len(fake.submitted) == 1


async def test_launch_conflict_is_a_409() -> None:
    fake = FakeDaemon(results={"start": CommandResult("conflict", "already running (state ready)", "ready")})
    async with client(fake) as c:
        r = await c.post("/group/launch", json={"rung": "base"})
    assert r.status_code == 409
