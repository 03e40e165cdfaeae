"""Fixtures: the real app over a fake supervisor, a bundle directory and a journal."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from fake_supervisor import FakeSupervisor, attach
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from api.app import create_app
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.status.journal import Journal

TOKEN = "s3cret-token-value-0123456789"
BUNDLE = "20250101T000000Z-startup_stall"


def make_bundle(diag_dir: Path, bundle_id: str, summary: dict[str, object] | None = None) -> Path:
    d = diag_dir / bundle_id
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary if summary is not None else {"id": bundle_id}))
    (d / "summary.txt").write_text(f"bundle {bundle_id}\n")
    (d / "py-spy-4242.txt").write_text("Thread 0x1 (idle)\n")
    return d


def client_for(app: FastAPI, token: str | None = None) -> httpx.AsyncClient:
    # As the CLI does (api/browser.py): a POST without a JSON body carries a non-simple header.
    headers = {"X-Requested-By": "tests"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", headers=headers)


class RawResponse(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


async def raw_call(
    app: FastAPI,
    method: str,
    target: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
    body: bytes = b"",
) -> RawResponse:
    """Send a request target exactly as given, decoded the way uvicorn decodes it.

    httpx normalises `..` and some escapes away before sending; a client on a socket need not.
    """
    raw_path, _, query = target.partition(b"?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": urllib.parse.unquote(raw_path.decode("latin-1")),
        "raw_path": raw_path,
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"test"), *(headers or [])],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8900),
    }
    sent_body = False
    finished = asyncio.Event()
    out: dict[str, Any] = {"status": 0, "headers": {}, "body": b""}

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")
            if not message.get("more_body", False):
                finished.set()

    await app(scope, receive, send)
    finished.set()
    return RawResponse(out["status"], out["headers"], out["body"])


@pytest.fixture
def raw() -> Callable[..., Any]:
    return raw_call


@pytest.fixture
def token() -> str:
    return TOKEN


@pytest.fixture
def handle() -> FakeSupervisor:
    return FakeSupervisor()


@pytest.fixture
def diag_dir(tmp_path: Path) -> Path:
    d = tmp_path / "diagnostics"
    d.mkdir()
    make_bundle(d, BUNDLE, {"cause": "startup_stall", "hang_class": "idle_deadlock"})
    return d


@pytest.fixture
def bundle_maker() -> Callable[..., Path]:
    return make_bundle


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    j = Journal(tmp_path / "events.jsonl")
    j.append("state_changed", old="starting", new="ready")
    return j


@pytest.fixture
def make_app(handle: FakeSupervisor, diag_dir: Path, journal: Journal) -> Callable[..., FastAPI]:
    def factory(token: str | None = None, max_body_bytes: int = 4096, **kwargs: Any) -> FastAPI:
        registry = CollectorRegistry()
        SupervisorMetrics(registry, handle.snapshot)
        return attach(
            create_app(
                None,
                token=token,
                diag_dir=diag_dir,
                journal=journal,
                registry=registry,
                max_body_bytes=max_body_bytes,
                **kwargs,
            ),
            handle,
        )

    return factory


@pytest.fixture
def make_client() -> Callable[..., httpx.AsyncClient]:
    return client_for


@pytest.fixture
async def client(make_app: Callable[..., FastAPI]) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(make_app()) as c:
        yield c
