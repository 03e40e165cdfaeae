"""The API's bearer token: where it comes from, where the daemon may listen, and the check.

The token is compared as bytes in constant time and never logged or echoed; the file holding it
must be private to its owner, like an ssh key.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import stat
from collections.abc import Collection, Mapping
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from supervisor.config.settings import ApiSettings, ConfigError

OPEN_PATHS = frozenset({"/livez", "/readyz", "/metrics"})
UNAUTHORIZED_DETAIL = "missing or invalid bearer token"
CHALLENGE = 'Bearer realm="sglang-supervisor"'  # the WWW-Authenticate header of a 401


def load_token(settings: ApiSettings, env: Mapping[str, str]) -> str | None:
    """The token from `[api] token_file`, else from the environment variable `token_env`, else None."""
    if settings.token_file:
        return _read_token_file(Path(settings.token_file))
    value = env.get(settings.token_env, "").strip()
    return value or None


def _read_token_file(path: Path) -> str:
    where = f"[api] token_file {str(path)!r}"
    try:
        st = path.stat()
    except OSError as err:
        raise ConfigError(f"{where}: cannot read it: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where}: not a regular file")
    if st.st_mode & 0o077:
        raise ConfigError(
            f"{where}: readable or writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"make it private with `chmod 600 {path}`"
        )
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{where}: cannot read it: {err.strerror or err}") from None
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    if not token:
        raise ConfigError(f"{where}: the file is empty; put a long random token in it")
    if any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(f"{where}: the token must be one line of printable characters without spaces")
    return token


def is_loopback(host: str) -> bool:
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond this machine without a token."""
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"[api] host {host!r} is not a loopback address and no API token is configured: "
            "set [api] token_file (mode 0600) or the token environment variable, or bind 127.0.0.1"
        )


class BearerAuth:
    """ASGI middleware: every HTTP request but the open probes needs `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str | None, open_paths: Collection[str] = OPEN_PATHS) -> None:
        self.app = app
        self._token = token.encode("utf-8") if token is not None else None
        self._open = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._token is None or scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] in self._open:
            await self.app(scope, receive, send)
            return
        if authorized(scope, self._token):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await _unauthorized(send)


def authorized(scope: Scope, token: bytes) -> bool:
    """Whether any `Authorization` header of the request is `Bearer <token>` (scheme in any case)."""
    for name, value in scope.get("headers", ()):
        if name.lower() != b"authorization":
            continue
        scheme, _, credentials = bytes(value).strip().partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token):
            return True
    return False


async def _unauthorized(send: Send) -> None:
    body = json.dumps({"error": "unauthorized", "detail": UNAUTHORIZED_DETAIL}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", CHALLENGE.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
