"""The token: where it may come from, where the daemon may listen without one, and the check."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from structlog.testing import capture_logs

from supervisor.common.apitoken import check_bind, is_loopback, load_token
from supervisor.common.configerror import ConfigError
from supervisor.config.settings import ApiSettings

PROTECTED = [
    ("GET", "/status"),
    ("POST", "/restart"),
    ("POST", "/diagnose"),
    ("POST", "/stop"),
    ("POST", "/start"),
    ("POST", "/reload"),
    ("GET", "/diagnostics"),
    ("GET", "/diagnostics/20250101T000000Z-startup_stall"),
    ("GET", "/diagnostics/20250101T000000Z-startup_stall/summary.txt"),
    ("GET", "/events"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/no-such-route"),
]


def _token_file(tmp_path: Path, content: str, mode: int) -> Path:
    p = tmp_path / "token"
    p.write_text(content)
    os.chmod(p, mode)
    return p


def test_token_file_private_is_read_and_stripped(tmp_path: Path) -> None:
    p = _token_file(tmp_path, "  abc123-XYZ\n", 0o600)
    assert load_token(ApiSettings(token_file=str(p)), {}) == "abc123-XYZ"
    os.chmod(p, 0o400)
    assert load_token(ApiSettings(token_file=str(p)), {"SGLANG_SUPERVISOR_TOKEN": "from-env"}) == "abc123-XYZ"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660, 0o666])
def test_token_file_readable_or_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    p = _token_file(tmp_path, "abc123", mode)
    with pytest.raises(ConfigError) as err:
        load_token(ApiSettings(token_file=str(p)), {})
    assert "chmod 600" in str(err.value)
    assert f"{mode:04o}" in str(err.value)
    assert "abc123" not in str(err.value)


@pytest.mark.parametrize("content", ["", "   \n", "two words", "tab\there"])
def test_token_file_empty_or_malformed_is_refused(tmp_path: Path, content: str) -> None:
    p = _token_file(tmp_path, content, 0o600)
    with pytest.raises(ConfigError, match="token_file"):
        load_token(ApiSettings(token_file=str(p)), {})


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_token_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    p = _token_file(tmp_path, "abc123", 0o600)
    os.chown(p, 65534, 65534)  # nobody's: 0600, but nobody can rewrite the daemon's token
    with pytest.raises(ConfigError, match=r"owned by uid 65534, not by this process's user"):
        load_token(ApiSettings(token_file=str(p)), {})


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_root_s_client_reads_the_service_user_s_token(tmp_path: Path) -> None:
    """After systemd/README.md's dedicated-user steps the token is the service user's; root's CLI must
    still read it (found under a real systemd: tests/systemd_real). The daemon's rule stays strict."""
    p = _token_file(tmp_path, "abc123", 0o600)
    os.chown(p, 65534, 65534)
    assert load_token(ApiSettings(token_file=str(p)), {}, client=True) == "abc123"
    p.chmod(0o640)  # private it must still be
    with pytest.raises(ConfigError, match="readable or writable by group or others"):
        load_token(ApiSettings(token_file=str(p)), {}, client=True)


def test_token_file_missing_or_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_token(ApiSettings(token_file=str(tmp_path / "absent")), {})
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_token(ApiSettings(token_file=str(d)), {})


def test_token_from_environment() -> None:
    assert load_token(ApiSettings(), {"SGLANG_SUPERVISOR_TOKEN": " t0k \n"}) == "t0k"
    assert load_token(ApiSettings(token_env="MY_TOKEN"), {"MY_TOKEN": "x"}) == "x"
    assert load_token(ApiSettings(), {"SGLANG_SUPERVISOR_TOKEN": "  "}) is None
    assert load_token(ApiSettings(), {}) is None


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_binds_need_no_token(host: str) -> None:
    assert is_loopback(host)
    check_bind(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "example.com", "", "localhost.evil"])
def test_non_loopback_bind_without_token_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match="token"):
        check_bind(host, None)
    check_bind(host, "a-token")


@pytest.mark.parametrize(("method", "path"), PROTECTED)
async def test_missing_or_wrong_token_is_401(
    make_app: Callable[..., FastAPI],
    make_client: Callable[..., httpx.AsyncClient],
    token: str,
    method: str,
    path: str,
) -> None:
    app = make_app(token=token)
    wrong = [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {token}x"},
        {"Authorization": f"Bearer {token[:-1]}"},
        {"Authorization": f"Basic {token}"},
        {"Authorization": token},
        {"Authorization": "Bearer"},
        {"X-Token": token},
    ]
    async with make_client(app) as c:
        for headers in wrong:
            r = await c.request(method, path, headers=headers, json={} if method == "POST" else None)
            assert r.status_code == 401, (headers, r.status_code)
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert r.json()["error"] == "unauthorized"
            assert token not in r.text
            assert token not in str(r.headers)


async def test_right_token_passes_in_any_scheme_case(
    make_app: Callable[..., FastAPI], make_client: Callable[..., httpx.AsyncClient], token: str
) -> None:
    async with make_client(make_app(token=token)) as c:
        for scheme in ("Bearer", "bearer", "BEARER"):
            r = await c.get("/status", headers={"Authorization": f"{scheme} {token}"})
            assert r.status_code == 200


async def test_probes_and_metrics_are_open(
    make_app: Callable[..., FastAPI], make_client: Callable[..., httpx.AsyncClient], token: str
) -> None:
    async with make_client(make_app(token=token)) as c:
        assert (await c.get("/livez")).status_code == 200
        assert (await c.get("/readyz")).status_code == 200
        assert (await c.get("/metrics")).status_code == 200
        assert (await c.get("/livez/")).status_code == 401  # only the exact paths are open


async def test_openapi_declares_bearer_security(
    make_app: Callable[..., FastAPI], make_client: Callable[..., httpx.AsyncClient], token: str
) -> None:
    async with make_client(make_app(token=token), token) as c:
        schema = (await c.get("/openapi.json")).json()
    assert schema["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            if path in ("/livez", "/readyz", "/metrics"):
                assert op["security"] == [], (method, path)
                assert "401" not in op["responses"], (method, path)
            else:
                assert op["security"] == [{"bearer": []}], (method, path)
                assert "401" in op["responses"], (method, path)
    assert token not in str(schema)


async def test_openapi_without_a_token_declares_no_security(
    make_app: Callable[..., FastAPI], make_client: Callable[..., httpx.AsyncClient]
) -> None:
    async with make_client(make_app(token=None), None) as c:
        schema = (await c.get("/openapi.json")).json()
    assert "securitySchemes" not in schema.get("components", {})
    assert all("401" not in op["responses"] for ops in schema["paths"].values() for op in ops.values())


async def test_no_interactive_docs_that_need_a_cdn(
    make_app: Callable[..., FastAPI], make_client: Callable[..., httpx.AsyncClient], token: str
) -> None:
    async with make_client(make_app(token=token), token) as c:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            r = await c.get(path)
            assert r.status_code == 404, path
            assert "cdn" not in r.text.lower()
        assert (await c.get("/openapi.json")).status_code == 200


async def test_token_never_logged(
    make_app: Callable[..., FastAPI], make_client: Callable[..., httpx.AsyncClient], token: str
) -> None:
    with capture_logs() as logs:
        async with make_client(make_app(token=token), token) as c:
            await c.get("/status")
            await c.get("/status", headers={"Authorization": f"Bearer {token}-wrong"})
    assert token not in str(logs)
