"""How the app is put together: routers over `Depends(get_supervisor)`, the token as a dependency,
the schema from declarations, one readiness rule, and docs/API.md's table as the contract."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_supervisor import FakeSupervisor, attach, sample_snapshot
from fastapi import APIRouter, FastAPI, Security
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import app as app_module
from api.app import create_app, include_protected
from api.deps import ApiContext, Supervisor, get_supervisor, require_token
from api.errors import http_exception_handler
from api.readiness import is_ready
from api.routes import commands, probes
from supervisor.policy.lifecycle import State
from supervisor.status.journal import Journal

AppFactory = Callable[..., FastAPI]
ClientFactory = Callable[..., httpx.AsyncClient]
API_MD = Path(__file__).resolve().parents[2] / "docs" / "API.md"


async def test_routes_read_the_supervisor_through_the_dependency(
    make_app: AppFactory, make_client: ClientFactory
) -> None:
    app = make_app()
    async with make_client(app) as c:
        assert (await c.get("/status")).json()["state"] == "ready"
        other = FakeSupervisor(sample_snapshot(state="failed", rung="no-spec"))
        app.dependency_overrides[get_supervisor] = lambda: other  # swapped: every route sees the new one
        assert (await c.get("/status")).json()["rung"] == "no-spec"
        assert (await c.get("/readyz")).json() == {"ready": False, "state": "failed"}
        assert (await c.post("/stop")).status_code == 202
        assert [cmd.kind for cmd in other.submitted] == ["stop"]


async def test_an_app_with_no_supervisor_answers_503_not_500(tmp_path: Path, make_client: ClientFactory) -> None:
    app = create_app(
        None,
        token=None,
        diag_dir=tmp_path,
        journal=Journal(tmp_path / "events.jsonl"),
        registry=CollectorRegistry(),
        max_body_bytes=4096,
    )
    async with make_client(app) as c:
        for method, path in (("GET", "/status"), ("POST", "/restart"), ("GET", "/readyz"), ("GET", "/livez")):
            r = await c.request(method, path)
            assert r.status_code == 503, (path, r.text)
            assert r.json() == {"error": "unavailable", "detail": "no supervisor is attached to this API yet"}
        assert (await c.get("/diagnostics")).status_code == 200  # what needs no supervisor still answers


async def test_the_token_dependency_holds_a_router_shut_without_the_middleware(tmp_path: Path) -> None:
    """`require_token` is a real check, not only the schema's declaration: here no BearerAuth runs."""
    handle = FakeSupervisor()
    app = FastAPI()
    app.add_exception_handler(StarletteHTTPException, http_exception_handler)
    app.state.context = ApiContext(
        diag_dir=tmp_path, journal=Journal(tmp_path / "e.jsonl"), registry=CollectorRegistry(), redact=str, token="t0k"
    )
    app.include_router(commands.router, dependencies=[Security(require_token)])
    app.include_router(probes.router)
    attach(app, handle)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic t0k"}):
            r = await c.post("/stop", headers=headers)
            assert r.status_code == 401, headers
            assert r.json() == {"error": "unauthorized", "detail": "missing or invalid bearer token"}
            assert r.headers["www-authenticate"].startswith("Bearer")
        assert handle.submitted == []
        assert (await c.post("/stop", headers={"Authorization": "bearer t0k"})).status_code == 202
        assert (await c.get("/readyz")).status_code == 503  # the probes' router has no token dependency


@pytest.mark.parametrize("state", list(State))
def test_ready_means_serving(state: State) -> None:
    assert is_ready(sample_snapshot(state=state.value)) is (state in (State.READY, State.DEGRADED))


async def test_readyz_answers_from_the_one_readiness_rule(
    make_app: AppFactory, make_client: ClientFactory, handle: FakeSupervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group-aware rule replaces `is_ready` and /readyz follows, with nothing else changed."""
    handle.snap = sample_snapshot(state="starting")
    async with make_client(make_app()) as c:
        assert (await c.get("/readyz")).status_code == 503
        monkeypatch.setattr(probes, "is_ready", lambda snapshot: snapshot.state == "starting")
        assert (await c.get("/readyz")).json() == {"ready": True, "state": "starting"}


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref" and isinstance(v, str)] + [
            r for v in node.values() for r in _refs(v)
        ]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


@pytest.mark.parametrize("token", [None, "t0k-0123456789"])
async def test_every_schema_reference_resolves(
    make_app: AppFactory, make_client: ClientFactory, token: str | None
) -> None:
    async with make_client(make_app(token=token, log_file=Path("/nonexistent/server.log")), token) as c:
        schema = (await c.get("/openapi.json")).json()
    names = set(schema["components"]["schemas"])
    refs = _refs(schema["paths"])
    assert refs and {r.removeprefix("#/components/schemas/") for r in refs} <= names
    ui_401 = schema["paths"]["/ui"]["get"]["responses"].get("401")
    if token is not None:  # without credentials the page answers its login form (issue 38), not JSON
        assert ui_401 is not None and list(ui_401["content"]) == ["text/html"]


def _documented() -> dict[tuple[str, str], tuple[str, set[str]]]:
    """docs/API.md's route table: (method, path) -> (success code, error codes)."""
    rows: dict[tuple[str, str], tuple[str, set[str]]] = {}
    for line in API_MD.read_text().splitlines():
        m = re.match(r"\| `(GET|POST) ([^`?]+)[^`]*` \| .* \| (\d{3}) \| ([^|]*) \|$", line)
        if m is None:
            continue
        path = m[2].replace("{id}", "{bundle_id}").replace("{file}", "{name}")
        errors = set(re.findall(r"\d{3}", m[4]))
        rows[(m[1].lower(), path)] = (m[3], errors)
    return rows


async def test_the_schema_serves_what_docs_api_md_documents(make_app: AppFactory, make_client: ClientFactory) -> None:
    token = "t0k-0123456789"
    async with make_client(make_app(token=token, log_file=Path("/nonexistent/server.log")), token) as c:
        schema = (await c.get("/openapi.json")).json()
    served = {(m, p): set(op["responses"]) for p, ops in schema["paths"].items() for m, op in ops.items()}
    documented = _documented()
    assert len(documented) >= 14
    assert set(served) == set(documented) | {("get", "/ui")}  # /ui has its own section, not a table row
    for key, (success, errors) in documented.items():
        assert success in served[key], key
        assert errors <= served[key], (key, errors - served[key])


def test_routes_live_in_routers_not_in_the_factory() -> None:
    """create_app assembles: no route (nor any other function) is defined inside it."""
    tree = ast.parse(Path(app_module.__file__ or "").read_text())
    (factory,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "create_app"]
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    nested = [getattr(n, "name", "<lambda>") for n in ast.walk(factory) if isinstance(n, functions)]
    assert nested == ["create_app"]
    routers = {
        ast.unparse(n.args[-1]).removesuffix(".router")
        for n in ast.walk(factory)
        if isinstance(n, ast.Call) and ast.unparse(n.func) in ("app.include_router", "include_protected")
    }
    assert routers >= {"status", "commands", "diagnostics", "events", "probes", "logs", "page"}


async def test_a_router_added_later_is_behind_the_token_and_documented(
    make_app: AppFactory, make_client: ClientFactory, handle: FakeSupervisor
) -> None:
    """How the daemon adds a router after create_app (the group's member routes): include_protected."""
    extra = APIRouter(prefix="/extra", tags=["extra"])

    @extra.get("/ping")
    async def ping(supervisor: Supervisor) -> dict[str, str]:
        return {"state": supervisor.snapshot().state}

    token = "t0k-0123456789"
    app = make_app(token=token)
    include_protected(app, extra)
    async with make_client(app) as c:
        assert (await c.get("/extra/ping")).status_code == 401
        ok = await c.get("/extra/ping", headers={"Authorization": f"Bearer {token}"})
        assert ok.json() == {"state": handle.snap.state}
        schema = (await c.get("/openapi.json", headers={"Authorization": f"Bearer {token}"})).json()
    op = schema["paths"]["/extra/ping"]["get"]
    assert op["security"] == [{"bearer": []}] and "401" in op["responses"]
