"""Browsers cannot be used against the API (issue 33): no cross-site request changes anything, and
no DNS-rebound name reaches it.

`BrowserGuard` (ASGI middleware) refuses, before any route or the token check runs:
- a `Host` the daemon does not answer to (421): on a loopback bind only the loopback names and
  `[api] allowed_hosts`; on any other bind those names, IP literals (a rebinding attack needs a
  name; Kubernetes probes and Prometheus use the pod's IP) and this machine's own names;
- an `Origin` (when the browser sends one) that is neither the request's own host nor an allowed
  one on the request's own port (issue 50: a page on another port of the same host is another
  origin), and a `Sec-Fetch-Site: cross-site` on a state-changing request (403);
and `simple_post` (the command routes' dependency `api.deps.non_simple`, so unknown methods stay
405s) refuses a state-changing request that a page could send without a CORS preflight (415): it
needs a JSON body (`Content-Type: application/json`) or a non-simple header (`Authorization`,
`X-Requested-By`). The page's own forms (`/ui/login`, `/ui/logout`, `/ui/action`) carry a CSRF
token instead (api/session.py).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import send_error
from supervisor.common.apitoken import is_loopback

# The only "simple" method that changes anything here: a page can send a POST without a preflight;
# PUT, PATCH and DELETE need one (and have no route: 405).
CHANGING_METHODS = frozenset({"POST"})
PROBE_PATHS = frozenset({"/livez", "/readyz"})  # no information a rebound page could want
NON_SIMPLE_HEADERS = (b"authorization", b"x-requested-by")
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "127.0.0.1", "::1"})
CLIENT_HEADER = ("X-Requested-By", "sglang-supervisor")  # what the CLI and the group leader send


@dataclass(frozen=True)
class HostPolicy:
    """The names the API answers to. `any_host`: `allowed_hosts = ["*"]` (a proxy in front checks)."""

    names: frozenset[str]
    loopback_bind: bool
    any_host: bool = False

    def allows(self, host: str) -> bool:
        name = host_name(host)
        if self.any_host or name in self.names:
            return True
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return False
        return ip.is_loopback or not self.loopback_bind


def host_policy(bind_host: str, allowed_hosts: Iterable[str], machine_names: Iterable[str] | None = None) -> HostPolicy:
    """The policy for a daemon bound to `bind_host` with `[api] allowed_hosts`."""
    allowed = {host_name(h) for h in allowed_hosts}
    loopback = is_loopback(bind_host)
    names = set(allowed - {"*"})
    if loopback:
        names |= LOOPBACK_NAMES
    else:
        names.add(host_name(bind_host))
        names |= {host_name(n) for n in (machine_names if machine_names is not None else _machine_names())}
    return HostPolicy(names=frozenset(n for n in names if n), loopback_bind=loopback, any_host="*" in allowed)


def _machine_names() -> set[str]:
    names = {socket.gethostname()}
    with contextlib.suppress(OSError):
        names.add(socket.getfqdn())
    return names


def host_name(host: str) -> str:
    """`Host`-header form to a bare lower-case name: `[::1]:8900` -> `::1`, `Node1:80` -> `node1`."""
    h = host.strip().lower()
    if h.startswith("["):
        return h[1:].split("]", 1)[0]
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def refusal(scope: Scope, policy: HostPolicy | None) -> tuple[int, str, str] | None:
    """Why this request is refused (status, error, detail), or None: the guard's pure decision."""
    path = scope.get("path", "")
    method = scope.get("method", "GET").upper()
    host = _header(scope, b"host") or ""
    if policy is not None and path not in PROBE_PATHS:
        probe_only = path == "/metrics" and not policy.loopback_bind
        if not probe_only and not policy.allows(host):
            return (
                421,
                "unknown_host",
                f"this daemon does not answer to Host {host_name(host)!r}; add it to [api] allowed_hosts "
                "if it is a name of this machine (a guard against DNS rebinding)",
            )
    origin = _header(scope, b"origin")
    if origin is not None and not _origin_ok(origin, host, policy):
        return (403, "cross_origin", f"requests from Origin {origin[:200]!r} are refused; use the page or the CLI")
    if method in CHANGING_METHODS and (_header(scope, b"sec-fetch-site") or "").lower() == "cross-site":
        return (403, "cross_origin", "a cross-site request cannot change anything here")
    return None


def simple_post(scope: Scope) -> str | None:
    """Why this POST is one a web page could send without a CORS preflight, or None when it is not:
    it has a JSON body or a non-simple header (`Authorization`, `X-Requested-By`)."""
    if scope.get("method", "GET").upper() not in CHANGING_METHODS:
        return None
    if any(_header(scope, n) is not None for n in NON_SIMPLE_HEADERS):
        return None
    media = (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
    if media == "application/json":
        return None
    sent = f"Content-Type {media!r}" if media else "no Content-Type"
    return (
        "a POST needs a JSON body (Content-Type: application/json) or an Authorization or "
        f"X-Requested-By header, so that no web page can send it; this request had {sent} "
        "(e.g. curl -X POST -H 'Content-Type: application/json' -d '{}' ...)"
    )


def _origin_ok(origin: str, host: str, policy: HostPolicy | None) -> bool:
    if origin == "null":
        return False
    try:
        parts = urlsplit(origin)
        netloc = parts.netloc
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not netloc:
        return False
    if netloc.lower() == host.strip().lower():
        return True  # same origin as the request itself
    if policy is None:
        return False
    if policy.any_host:
        return True
    # Another name of this daemon, on the API's own port: a page served on another port of the same
    # host is another origin (and the browser sends it the session cookie too: api/session.py).
    return host_name(netloc) in policy.names and _port(parts.scheme, netloc) == _port(parts.scheme, host)


def _port(scheme: str, netloc: str) -> int | None:
    """The port of `netloc` (`host`, `host:port`, `[v6]:port`), the scheme's default when it has none;
    None when it is not a port."""
    try:
        explicit = urlsplit(f"{scheme}://{netloc.strip()}").port
    except ValueError:
        return None
    return explicit if explicit is not None else {"http": 80, "https": 443}.get(scheme)


class BrowserGuard:
    def __init__(self, app: ASGIApp, policy: HostPolicy | None) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = refusal(scope, self.policy)
            if refused is not None:
                await send_error(send, *refused)
                return
        await self.app(scope, receive, send)
