"""The status page's login sessions (issue 38): a person types the API token once into `/ui/login`
and gets a session cookie; scripts keep the bearer header.

A session is a random id the browser holds in an HttpOnly, SameSite=Strict cookie and the daemon
holds in memory, with its expiry (`SESSION_TTL_S`, 12 h) and its CSRF token (the page's forms
carry it; api/browser.py lets only those forms through without a JSON body). Sessions live in the
daemon's memory only: logging out ends one at once, and rotating the token (which takes a daemon
restart to be read) ends them all. A session admits the page, the safe (GET) routes it links to and
the page's own forms; every other state-changing route needs the bearer token.

A browser sends a host's cookies to every port of it (cookies predate origins: RFC 6265 scopes
them by host and path, never by port), so a session cookie for the API on 127.0.0.1:8900 also
reaches whatever serves 127.0.0.1:3000 (issue 50). A session is therefore bound to the origin it
was made on, the login request's `Host` (host and port): presented with another `Host` it admits
nothing. That stops the cookie from working through a browser on another port (and a second
daemon on the same host); a local service that receives the cookie and replays it to this port
with this port's `Host` is not stopped by anything a cookie can carry (docs/SAFETY.md).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import Scope

SESSION_COOKIE = "sgs_session"
SESSION_TTL_S = 12 * 3600.0
MAX_SESSIONS = 256  # the oldest goes first: a flood of logins cannot grow the daemon


@dataclass(frozen=True)
class Session:
    name: str  # a short digest of the id, safe to journal ("who asked")
    csrf: str
    expires_at: float  # wall-clock seconds
    client: str
    origin: str = ""  # the login's Host (host:port, lower case); another Host is not this session's


class SessionStore:
    def __init__(self, token: str | None, ttl_s: float = SESSION_TTL_S, clock: Callable[[], float] = time.time) -> None:
        self._token = token.encode("utf-8") if token is not None else None
        self._ttl_s = ttl_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}  # by the sha256 of the cookie's value
        # With no token there is no login; the page's forms still need a token no other site can read.
        self._anon_csrf = secrets.token_urlsafe(24)

    @property
    def needs_login(self) -> bool:
        return self._token is not None

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    def login(self, offered: str, client: str, origin: str = "") -> tuple[str, Session] | None:
        """A new session (cookie value, record) for `origin` (the request's Host) when `offered` is
        the token; None otherwise."""
        if self._token is None or not hmac.compare_digest(offered.strip().encode("utf-8"), self._token):
            return None
        self._prune()
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[min(self._sessions, key=lambda k: self._sessions[k].expires_at)]
        value = secrets.token_urlsafe(32)
        key = _key(value)
        session = Session(
            key[:10], secrets.token_urlsafe(24), self._clock() + self._ttl_s, client, origin.strip().lower()
        )
        self._sessions[key] = session
        return value, session

    def get(self, value: str | None, origin: str | None = None) -> Session | None:
        """The live session of cookie `value`; with `origin` (the request's Host), only if it was
        made on that origin."""
        if not value:
            return None
        key = _key(value)
        session = self._sessions.get(key)
        if session is not None and session.expires_at <= self._clock():
            del self._sessions[key]
            return None
        if session is not None and origin is not None and session.origin != origin.strip().lower():
            return None
        return session

    def logout(self, value: str | None) -> bool:
        return bool(value) and self._sessions.pop(_key(value or ""), None) is not None

    def csrf_ok(self, session: Session | None, offered: str) -> bool:
        want = session.csrf if session is not None else (None if self._token is not None else self._anon_csrf)
        return want is not None and hmac.compare_digest(offered.encode("utf-8"), want.encode("utf-8"))

    def csrf_for(self, session: Session | None) -> str:
        return session.csrf if session is not None else self._anon_csrf

    def from_scope(self, scope: Scope) -> Session | None:
        return self.get(cookie(scope, SESSION_COOKIE), request_host(scope))

    def _prune(self) -> None:
        now = self._clock()
        for key in [k for k, s in self._sessions.items() if s.expires_at <= now]:
            del self._sessions[key]


def _key(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()


def request_host(scope: Scope) -> str:
    """The request's `Host` header as sent (host and port), or "" without one."""
    for key, raw in scope.get("headers", ()):
        if key.lower() == b"host":
            return bytes(raw).decode("latin-1")
    return ""


def cookie(scope: Scope, name: str) -> str | None:
    """The named cookie's value from the request's Cookie headers, or None."""
    for key, raw in scope.get("headers", ()):
        if key.lower() != b"cookie":
            continue
        for part in bytes(raw).decode("latin-1").split(";"):
            k, sep, v = part.strip().partition("=")
            if sep and k == name:
                return v.strip()
    return None


def set_cookie_header(value: str, max_age_s: float, secure: bool) -> str:
    flags = "; Secure" if secure else ""
    return f"{SESSION_COOKIE}={value}; Path=/; Max-Age={int(max_age_s)}; HttpOnly; SameSite=Strict{flags}"


def clear_cookie_header() -> str:
    return f"{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
