"""The client's long-running verbs: `status --watch`, `logs [-f]`, `events --follow`, and `--wait`
on stop, start and restart.

`logs` and `events --follow` read one streamed HTTP answer (the daemon follows the file and
sends lines as they come); only `--watch` and `--wait` ask `GET /status` again, at a person's
pace. Ctrl-C ends a watch or a follow with the exit code of what was last seen (0 for a follow).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional, TextIO

import httpx

from supervisor.client.format import format_answer, format_error, format_event, format_status
from supervisor.client.terminal import sanitize
from supervisor.client.wait import (
    Before,
    Settled,
    Verb,
    settled,
    status_exit,
)
from supervisor.common.exitcodes import EXIT_AUTH, EXIT_ERROR, EXIT_OK, EXIT_TIMEOUT, EXIT_UNREACHABLE
from supervisor.common.waiting import WaitTimeout, wait_for

WAIT_POLL_S = 0.5
Send = Callable[..., httpx.Response]
Request = tuple[str, str, Optional[dict[str, object]], list[tuple[str, str]]]  # method, path, body, query


@dataclass(frozen=True)
class Conn:
    url: str
    token: str | None
    timeout: float
    send: Send
    token_from: str = ""  # where the token was read (said on a 401)
    utc: bool = False  # moments in UTC, not the host's zone (--utc)

    def request(self, method: str, path: str, body: dict[str, object] | None = None, params: Any = None) -> Any:
        return self.send(self.url, method, path, body, self.token, self.timeout, params)

    def status(self) -> Mapping[str, Any] | None:
        """The daemon's status, or None when it cannot be reached now (it may be restarting)."""
        try:
            r = self.request("GET", "/status")
        except (httpx.TimeoutException, httpx.TransportError):
            return None
        data = _json(r)
        return data if r.status_code == 200 and isinstance(data, dict) else None


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def watch(conn: Conn, interval: float, *, as_json: bool, out: TextIO, err: TextIO) -> int:
    """`status --watch`: the status again every `interval` s (one JSON line each with --json)."""
    interval = max(0.2, interval)
    tty = out.isatty() and not as_json
    code = EXIT_UNREACHABLE
    try:
        while True:
            try:
                r = conn.request("GET", "/status")
                data = _json(r)
                if r.status_code == 401:
                    print(format_error(401, data, conn.token_from), file=err)
                    return EXIT_AUTH
                code = status_exit(data) if isinstance(data, dict) else EXIT_ERROR
                frame = json.dumps(data) if as_json else format_status(data, conn.utc)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                code = EXIT_UNREACHABLE
                frame = (
                    json.dumps({"error": "unreachable", "detail": str(e)})
                    if as_json
                    else (f"cannot reach the daemon at {conn.url} ({e or type(e).__name__}); trying again")
                )
            if tty:
                out.write("\033[H\033[J")  # a screen of its own, as watch(1) does
            if not as_json:
                print(f"{_now()}  every {interval:g} s, Ctrl-C to stop", file=out)
            print(frame, file=out)
            if not as_json and not tty:
                print(file=out)
            out.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return code


def stream(conn: Conn, command: str, params: list[tuple[str, str]], *, as_json: bool) -> int:
    """`logs [-f]` and `events --follow`: print the streamed answer line by line as it arrives."""
    path = "/logs" if command == "logs" else "/events"
    follow = ("follow", "true") in params
    headers = {"Authorization": f"Bearer {conn.token}"} if conn.token else {}
    timeout = httpx.Timeout(conn.timeout, read=None if follow else conn.timeout)
    try:
        with (
            httpx.Client(base_url=conn.url.rstrip("/"), timeout=timeout, headers=headers, trust_env=False) as c,
            c.stream("GET", path, params=tuple(params)) as r,
        ):
            if r.status_code != 200:
                r.read()
                print(format_error(r.status_code, _json(r), conn.token_from), file=sys.stderr)
                return EXIT_AUTH if r.status_code == 401 else EXIT_ERROR
            if r.headers.get("x-launch"):  # logs --previous: which launch this is
                print(f"the launch before this one: {r.headers['x-launch']}", file=sys.stderr)
            tty = sys.stdout.isatty()  # the server's escapes must not reach a terminal (client/terminal.py)
            try:
                for line in r.iter_lines():
                    shown = _line(command, line, as_json, conn.utc)
                    print(sanitize(shown) if tty else shown, flush=True)
            except (httpx.RemoteProtocolError, httpx.ReadError):
                ended = True
            else:
                ended = follow  # a follow never ends by itself: the daemon ended it as it stopped
            if ended:
                print("error: the daemon closed the stream (it stopped or is restarting)", file=sys.stderr)
                return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK


def _line(command: str, line: str, as_json: bool, utc: bool = False) -> str:
    if command == "logs":
        return json.dumps({"line": line}) if as_json else line
    if as_json:
        return line
    try:
        record = json.loads(line)
    except ValueError:
        return line
    return format_event(record, utc) if isinstance(record, dict) else line


def command_and_wait(conn: Conn, command: str, req: Request, wait_s: float, *, as_json: bool) -> int:
    """Send stop/start/restart, then poll `/status` until `clientwait.settled` says it is done."""
    verbs: dict[str, Verb] = {"stop": "stop", "start": "start", "promote": "promote"}
    verb = verbs.get(command, "restart")
    before_doc = conn.status()
    if before_doc is None:
        raise httpx.ConnectError("no status answer before the command")
    before = Before.of(before_doc)
    method, path, body, params = req
    r = conn.request(method, path, body, params)
    answer = _json(r)
    if not 200 <= r.status_code < 300:
        if as_json:
            print(json.dumps(answer, indent=2))
        else:
            print(format_error(r.status_code, answer, conn.token_from), file=sys.stderr)
        return EXIT_AUTH if r.status_code == 401 else EXIT_ERROR
    if not as_json:
        print(format_answer(command, answer, waiting=True, utc=conn.utc), flush=True)
    said = answer.get("message") if isinstance(answer, dict) else None
    if verb == "start" and str(said or "").startswith("already running"):
        before = Before(before.state, None)  # nothing new will start: the server that runs settles it
    moved, last = False, before_doc

    def outcome_now() -> Settled | None:
        nonlocal moved, last
        now = conn.status()
        if now is None:
            return None
        last = now
        moved = moved or now.get("state") != before.state
        return settled(verb, before, now, moved)

    try:
        outcome = wait_for(outcome_now, timeout=wait_s, what=f"{command} settled", interval=WAIT_POLL_S)
    except WaitTimeout:
        outcome = Settled(EXIT_TIMEOUT, f"still {last.get('state')} after {wait_s:g} s ({last.get('reason') or '-'})")
    if as_json:
        doc = {"answer": answer, "status": last, "outcome": outcome.message, "exit": outcome.code}
        print(json.dumps(doc, indent=2))
    else:
        print(f"{command}: {outcome.message}", file=sys.stdout if outcome.code == EXIT_OK else sys.stderr)
    return outcome.code
