"""One delivery attempt to one target: an HTTP POST or an exec hook. Never raises; the outcome says
what happened, with every secret (the URL, the routing key) cut out of any error text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex

import httpx

from supervisor.alerting import shapes
from supervisor.alerting.events import NotifyEvent
from supervisor.common.configerror import ConfigError
from supervisor.common.toolproc import run_tool
from supervisor.config.alerting import PAGERDUTY_URL, NotifyTarget

REDACTED = "<redacted>"
HOOK_MARKER = "SGLANG_SUPERVISOR_HOOK_RUN"  # one value per hook run: what proves a process is its


@dataclass(frozen=True)
class Secrets:
    url: str | None = None
    routing_key: str | None = None

    def redact(self, text: str) -> str:
        for secret in (self.url, self.routing_key):
            if secret:
                text = text.replace(secret, REDACTED)
        return text


@dataclass(frozen=True)
class Attempt:
    ok: bool
    retry: bool  # worth another attempt (a timeout, a refused connection, 429, 5xx, a failing hook)
    status: int | None = None  # HTTP status or the hook's exit code
    error: str = ""


def read_secret(path: str, what: str) -> str:
    """One line from a private file; ConfigError naming the key and the fix otherwise."""
    p = Path(path)
    where = f"notify {what} {str(p)!r}"
    try:
        st = p.stat()
        raw = p.read_bytes()
    except OSError as err:
        raise ConfigError(f"{where}: cannot read it: {err.strerror or err}") from None
    if st.st_mode & 0o077:
        raise ConfigError(f"{where}: readable by group or others; make it private with `chmod 600 {p}`")
    try:
        value = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    if not value or any(c.isspace() for c in value):
        raise ConfigError(f"{where}: must hold one non-empty line without spaces")
    return value


def load_secrets(target: NotifyTarget) -> Secrets:
    url = read_secret(target.url_file, "url_file") if target.url_file else target.url
    if url is not None and not url.startswith(("http://", "https://")):
        raise ConfigError(f"notify {target.name!r}: url_file must hold an http:// or https:// URL")
    key = read_secret(target.routing_key_file, "routing_key_file") if target.routing_key_file else None
    if target.format == "pagerduty" and url is None:
        url = PAGERDUTY_URL
    return Secrets(url=url, routing_key=key)


def body_for(target: NotifyTarget, ev: NotifyEvent, secrets: Secrets) -> dict[str, object]:
    if target.kind == "webhook" and target.format == "slack":
        return shapes.slack(ev)
    if target.kind == "webhook" and target.format == "pagerduty":
        return shapes.pagerduty(ev, secrets.routing_key or "")
    return shapes.generic(ev)


async def post(client: httpx.AsyncClient, target: NotifyTarget, ev: NotifyEvent, secrets: Secrets) -> Attempt:
    """One POST, bounded as a whole by `timeout_s`: httpx's timeout bounds each read, so a receiver
    trickling its headers a byte at a time never tripped it (issue 33)."""
    try:
        return await asyncio.wait_for(_post(client, target, ev, secrets), target.timeout_s)
    except asyncio.TimeoutError:
        return Attempt(False, True, error=f"timed out after {target.timeout_s:g} s (the whole attempt)")


async def _post(client: httpx.AsyncClient, target: NotifyTarget, ev: NotifyEvent, secrets: Secrets) -> Attempt:
    assert secrets.url is not None
    try:
        # Streamed and never read: a receiver answering with a huge body costs nothing.
        async with client.stream(
            "POST",
            secrets.url,
            json=body_for(target, ev, secrets),
            timeout=httpx.Timeout(target.timeout_s),
            headers={"User-Agent": "sglang-supervisor"},
        ) as r:
            status = r.status_code
    except httpx.TimeoutException as err:
        return Attempt(False, True, error=f"timed out after {target.timeout_s:g} s ({type(err).__name__})")
    except Exception as err:  # refused, reset, DNS: the receiver may be back on the next attempt
        return Attempt(False, True, error=secrets.redact(f"{type(err).__name__}: {err}")[:300])
    if 200 <= status < 300:
        return Attempt(True, False, status)
    retry = status == 429 or status >= 500  # other 4xx: the request is wrong; retrying won't help
    return Attempt(False, retry, status, f"HTTP {status}")


async def run_hook(target: NotifyTarget, ev: NotifyEvent, base_env: Mapping[str, str]) -> Attempt:
    """The hook in a process group of its own, with a marker in its environment: at the timeout the
    group is killed, and so is every process of ours still carrying the marker (a `setsid` child
    leaves the group, not its environment)."""
    marker = token_hex(8)
    env = {**base_env, **shapes.hook_env(ev), HOOK_MARKER: marker}
    data = (json.dumps(shapes.generic(ev)) + "\n").encode()
    mark = (HOOK_MARKER, marker)
    res = await run_tool(
        target.argv, target.timeout_s, env=env, cap_bytes=8192, stdin=data, own_session=False, marker=mark
    )
    if res.missing:
        return Attempt(False, False, error=res.stderr[:300])
    if res.timed_out:
        return Attempt(False, True, error=f"timed out after {target.timeout_s:g} s (killed)")
    if res.exit_code == 0:
        return Attempt(True, False, 0)
    tail = res.stderr.strip().splitlines()[-1:] if res.stderr.strip() else []
    return Attempt(False, True, res.exit_code, f"exit {res.exit_code}" + (f": {tail[0][:200]}" if tail else ""))
