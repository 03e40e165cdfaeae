"""Schema-driven and property-based runs over every route: no 500, no crash, with and without auth.

schemathesis reads the app's own /openapi.json and sends valid and invalid requests to every
operation, checking status codes, content types and bodies against the schema. Hypothesis then
throws arbitrary paths, methods, headers and bodies at the raw ASGI app.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from pathlib import Path
from typing import Any

import schemathesis
from fake_supervisor import FakeSupervisor, attach
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from schemathesis.checks import negative_data_rejection, not_a_server_error

from api.app import create_app
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.status.journal import Journal

FUZZ_TOKEN = "fuzz-token-0123456789abcdef"
OPEN = {"/livez", "/readyz", "/metrics"}
FUZZ_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


FIXTURES = Path(__file__).parent / "fixtures"


def _app(token: str | None) -> FastAPI:
    """Over read-only fixtures: the API never writes the journal or the bundles."""
    handle = FakeSupervisor()
    registry = CollectorRegistry()
    SupervisorMetrics(registry, handle.snapshot)
    return attach(
        create_app(
            None,
            token=token,
            diag_dir=FIXTURES / "diagnostics",
            journal=Journal(FIXTURES / "events.jsonl"),
            registry=registry,
            max_body_bytes=64 * 1024,  # the default cap; 413s are tested in test_api_routes
        ),
        handle,
    )


# As every client of the API does (api/browser.py): a POST without a JSON body carries a non-simple header.
open_api = schemathesis.openapi.from_asgi("/openapi.json", _app(None))
authed_api = schemathesis.openapi.from_asgi(
    "/openapi.json", _app(FUZZ_TOKEN), headers={"Authorization": f"Bearer {FUZZ_TOKEN}"}
)

# The same token-protected app, with nobody supplying the token.
tokenless_api = schemathesis.openapi.from_asgi(
    "/openapi.json", _app(FUZZ_TOKEN), headers={"Authorization": f"Bearer {FUZZ_TOKEN}"}
)


@authed_api.auth()
class _Token:
    """Lets schemathesis add the token itself, so its negative cases may still leave it out."""

    def get(self, case: Any, ctx: Any) -> str:
        return FUZZ_TOKEN

    def set(self, case: Any, data: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


def no_500_and_no_bug(ctx: Any, response: Any, case: Any) -> bool | None:
    """Replaces "any 5xx is a failure": 503 is this API's documented "could not do it now",
    but a 503 whose error is `internal` is a bug the guard caught, and a 500 is never right."""
    assert response.status_code != 500, response.text
    if response.status_code >= 500:
        body = json.loads(response.text)
        assert body.get("error") != "internal", body
    return None


CHECKS: dict[str, Any] = {
    "excluded_checks": [not_a_server_error],
    "additional_checks": [no_500_and_no_bug],
}


def checks_for(case: Any) -> dict[str, Any]:
    """A query string has no JSON types: the fuzzer's "non-string" `event=false` arrives as the string
    "false", a well-formed event name that matches nothing, and an empty list is the right answer.
    Requests without `event` keep `/events`'s other parameters (limit, since) under the negative check."""
    query = case.query or {}
    if case.path == "/events" and "event" in query:
        return {**CHECKS, "excluded_checks": [*CHECKS["excluded_checks"], negative_data_rejection]}
    return CHECKS


@open_api.parametrize()
@FUZZ_SETTINGS
def test_schema_without_token(case: Any) -> None:
    # As every client of the API does (api/browser.py): a POST without a JSON body says it is no page.
    case.headers = {**(case.headers or {}), "X-Requested-By": "fuzz"}
    case.call_and_validate(**checks_for(case))


@authed_api.parametrize()
@FUZZ_SETTINGS
def test_schema_with_token(case: Any) -> None:
    case.call_and_validate(**checks_for(case))


@tokenless_api.parametrize()
@FUZZ_SETTINGS
def test_schema_token_required(case: Any) -> None:
    case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    response = case.call()
    no_500_and_no_bug(None, response, case)
    if case.operation.path not in OPEN:
        assert response.status_code == 401, (case.operation.path, response.status_code)
        assert response.headers["www-authenticate"][0].startswith("Bearer")
        assert FUZZ_TOKEN not in response.text


RAW_APP = _app(None)
RAW_AUTHED_APP = _app(FUZZ_TOKEN)
ROUTES = [
    "/status",
    "/restart",
    "/diagnose",
    "/stop",
    "/start",
    "/diagnostics",
    "/diagnostics/b1",
    "/diagnostics/b1/summary.json",
    "/events",
    "/metrics",
    "/livez",
    "/readyz",
    "/openapi.json",
    "/docs",
]
NASTY = ["..", "%2e%2e", "%2F", "%00", "/", "//", "%", "%zz", "b1", "summary.txt", ".tmp-x", "~", "\\", "?", "#"]
segment = st.one_of(st.sampled_from(NASTY), st.text(min_size=0, max_size=12).map(lambda t: t.replace("?", "")))
target = st.one_of(
    st.sampled_from(ROUTES).map(str.encode),
    st.tuples(st.sampled_from(ROUTES), st.lists(segment, max_size=4)).map(
        lambda rs: ("/".join([rs[0], *rs[1]])).encode("utf-8", "surrogatepass")
    ),
    st.sampled_from(["/events"]).flatmap(lambda p: st.text(max_size=20).map(lambda q: f"{p}?limit={q}".encode())),
)
header_value = st.binary(max_size=40).filter(lambda b: b"\r" not in b and b"\n" not in b)
headers = st.lists(
    st.tuples(st.sampled_from([b"content-type", b"content-length", b"authorization", b"x-junk"]), header_value),
    max_size=3,
)
requests = st.tuples(
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]),
    target,
    headers,
    st.one_of(st.binary(max_size=300), st.sampled_from([b"{}", b'{"rung": "base"}', b"null", b"[]", b"{"])),
)


def _check_raw(response: Any) -> None:
    assert response.status != 500, response
    assert response.status != 0, "no response at all"
    if response.status >= 500:
        assert json.loads(response.body).get("error") != "internal", response.body


@given(request=requests)
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_raw_requests_never_500(raw: Any, request: tuple[str, bytes, list[tuple[bytes, bytes]], bytes]) -> None:
    method, path, hdrs, body = request
    _check_raw(asyncio.run(raw(RAW_APP, method, path, hdrs, body)))


@given(request=requests)
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_raw_requests_need_the_token(raw: Any, request: tuple[str, bytes, list[tuple[bytes, bytes]], bytes]) -> None:
    method, path, hdrs, body = request
    hdrs = [(k, v) for k, v in hdrs if k != b"authorization"]
    response = asyncio.run(raw(RAW_AUTHED_APP, method, path, hdrs, body))
    _check_raw(response)
    if urllib.parse.unquote(path.decode("latin-1").partition("?")[0]) not in OPEN:
        assert response.status == 401, (path, response.status)
        assert FUZZ_TOKEN.encode() not in response.body
