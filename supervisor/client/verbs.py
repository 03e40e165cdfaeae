"""Client commands against a running daemon: `status`, `restart`, `stop`, `start`, `diagnose`,
`reload`, `events`, `bundles`, `logs`. The daemon's address and token come from `--url`/`--token-file`,
else from the daemon's own config (`--config`, `$SGLANG_SUPERVISOR_CONFIG`, or the installed
/etc/sglang-supervisor/config.toml; only its `[api]` table is read), else the defaults.

Exit codes scripts can trust: 0 done, 1 the daemon answered with an error, 2 usage (bad
arguments, unreadable token file, bad URL), 3 the daemon could not be reached or did not answer
in time, 4 the daemon refused the token; `status` and `--wait` add one code per state and 124 for
a wait that ran out of time (supervisor/client/wait.py, docs/OPERATIONS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

import httpx

from supervisor.client import savefiles
from supervisor.client import stream as clientstream
from supervisor.client.format import TOKEN_ENV, format_answer, format_bundle, format_error
from supervisor.client.locate import CONFIG_ENV, ClientConfigError, api_settings, choose_config
from supervisor.client.wait import DEFAULT_WAIT_S, status_exit
from supervisor.common.exitcodes import EXIT_AUTH, EXIT_ERROR, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

DEFAULT_URL = "http://127.0.0.1:8900"
COMMANDS = ("status", "restart", "stop", "start", "promote", "diagnose", "reload", "events", "bundles", "logs")
DEFAULT_TIMEOUT_S = 15.0
# A capture runs py-spy over every process and gdb over a hung tree: minutes, not seconds.
DIAGNOSE_TIMEOUT_S = 600.0

__all__ = ["COMMANDS", "EXIT_AUTH", "EXIT_ERROR", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "run_client"]


class UsageError(Exception):
    pass


def add_client_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the client commands; `run_client` runs whichever was chosen."""
    helps = {
        "status": "show the supervisor's state, rung, progress, last incident, serving and GPUs",
        "restart": "restart the server now (stop, verify release, relaunch)",
        "stop": "stop the server and keep it stopped",
        "start": "start the server after a stop or out of failed",
        "promote": "try the preferred rung now (from a fallback rung); the current rung is not charged",
        "diagnose": "capture evidence now (py-spy, optionally gdb) and print the bundle",
        "reload": "re-read the daemon's config file (as SIGHUP or systemctl reload does)",
        "events": "show the event journal, oldest first (filter by --event and --since; --follow for new ones)",
        "bundles": "list diagnostic bundles, newest first, show one bundle's summary, or `get ID [FILE]` to download",
        "logs": "show the server's own output (stdout and stderr), secrets redacted; -f follows it",
    }
    for name in COMMANDS:
        p = subparsers.add_parser(name, help=helps[name], description=helps[name])
        p.add_argument(
            "--config",
            help=f"the daemon's config file: its [api] address and token (default: ${CONFIG_ENV}, "
            "else /etc/sglang-supervisor/config.toml when it exists)",
        )
        p.add_argument("--url", help=f"the daemon's API (default: from the config, else {DEFAULT_URL})")
        p.add_argument(
            "--token-file", help=f"file holding the API token (default: from the config, else ${TOKEN_ENV} if set)"
        )
        p.add_argument("--json", action="store_true", help="print the daemon's JSON answer as it is")
        p.add_argument(
            "--utc", action="store_true", help="times in UTC (default: this host's zone, ISO 8601 with the offset)"
        )
        p.add_argument("--timeout", type=float, help="seconds to wait for the answer")
        if name == "status":
            p.add_argument(
                "--watch",
                type=float,
                nargs="?",
                const=2.0,
                metavar="SECONDS",
                help="show it again every SECONDS (default 2) until Ctrl-C",
            )
        if name == "restart":
            p.add_argument("--rung", help="go straight to this rung of the ladder")
            p.add_argument("--reason", default="", help="recorded with the incident")
            p.add_argument("--diagnose", action="store_true", help="capture evidence before stopping")
        if name == "start":
            p.add_argument(
                "--rung", help="start on this rung (default: the current one; out of failed the preferred one)"
            )
        if name in ("stop", "promote"):
            p.add_argument("--reason", default="", help="recorded in the journal")
        if name in ("stop", "start", "restart", "promote"):
            what = "stopped and its port and GPUs verified free" if name == "stop" else "a new server serves"
            p.add_argument("--wait", action="store_true", help=f"wait until the server is {what}")
            p.add_argument(
                "--wait-timeout",
                type=float,
                default=DEFAULT_WAIT_S[name],
                metavar="SECONDS",
                help=f"give up waiting after this long, exit 124 (default {DEFAULT_WAIT_S[name]:g})",
            )
        if name == "diagnose":
            p.add_argument("--native", action=argparse.BooleanOptionalAction, help="py-spy --native")
            p.add_argument("--gdb", action=argparse.BooleanOptionalAction, help="also take gdb backtraces")
        if name == "events":
            p.add_argument("--limit", type=int, default=100, help="the last N events (1-1000, default 100)")
            p.add_argument("--event", action="append", help="only this event name (repeatable)")
            p.add_argument(
                "--since",
                help="only events at or after this time: ISO-8601 (UTC unless it says) or a span back from now "
                "(30m, 1h, 2d)",
            )
            p.add_argument("-f", "--follow", action="store_true", help="then keep printing new events until Ctrl-C")
        if name == "logs":
            p.add_argument("-n", "--lines", type=int, default=100, help="the last N lines (0-10000, default 100)")
            p.add_argument("-f", "--follow", action="store_true", help="then keep printing new lines until Ctrl-C")
            p.add_argument(
                "-p", "--previous", action="store_true", help="the output of the launch before this one (a crash's)"
            )
            p.add_argument(
                "--all",
                action="store_true",
                help="also the access lines of the daemon's own health and metrics polls (hidden by default)",
            )
        if name == "bundles":
            p.add_argument("id", nargs="?", help="show this bundle's summary instead of the list ('get': download)")
            p.add_argument("get_args", nargs="*", metavar="ID [FILE]", help="with get: the bundle, and one file of it")
            p.add_argument(
                "-o",
                "--output",
                help="get: where to write (default: ./ID/ for a whole bundle, ./FILE for one file; '-': stdout)",
            )
        p.set_defaults(client_command=name)


def run_client(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    command = getattr(args, "client_command", None) or getattr(args, "command", None)
    if command not in COMMANDS:
        print(f"error: unknown client command {command!r}", file=sys.stderr)
        return EXIT_USAGE
    environ = os.environ if env is None else env
    url = getattr(args, "url", None) or DEFAULT_URL
    where = "--url"
    try:
        url, token, where, token_from = _address(args, environ)
        timeout = args.timeout if args.timeout is not None else _default_timeout(command)
        conn = clientstream.Conn(url, token, timeout, _send, token_from, args.utc)
        if command == "bundles" and getattr(args, "id", None) == "get":
            return _get_bundle(url, args.get_args, args.output, token, timeout)
        if command == "bundles" and getattr(args, "get_args", None):
            raise UsageError(f"bundles {args.id} {' '.join(args.get_args)}: did you mean bundles get ID [FILE]?")
        if command == "bundles" and getattr(args, "id", None):
            return _show_bundle(url, args.id, token, timeout, as_json=args.json, utc=args.utc)
        if command == "status" and args.watch is not None:
            return clientstream.watch(conn, args.watch, as_json=args.json, out=sys.stdout, err=sys.stderr)
        if command in ("logs", "events") and (command == "logs" or args.follow):
            return clientstream.stream(conn, command, _stream_params(command, args), as_json=args.json)
        if command in ("stop", "start", "restart", "promote") and args.wait:
            return clientstream.command_and_wait(
                conn, command, _request_for(command, args), args.wait_timeout, as_json=args.json
            )
        method, path, body, params = _request_for(command, args)
        response = _send(url, method, path, body, token, timeout, params)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except (httpx.TimeoutException, httpx.TransportError) as err:
        print(f"error: cannot reach the daemon at {url} ({where}): {_transport_reason(err)}", file=sys.stderr)
        print(
            "next: is the daemon running (systemctl status sglang-supervisor)? Point the client at it with "
            "--url http://HOST:PORT or --config FILE (its [api] table)",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    return report(
        command, response, as_json=args.json, out=sys.stdout, err=sys.stderr, token_from=token_from, utc=args.utc
    )


def _address(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, str | None, str, str]:
    """(base URL, token, where the URL came from, where the token came from): explicit flags first,
    then the daemon's config ([api] only), then the defaults, said as such (never a silent fallback)."""
    url: str | None = getattr(args, "url", None)
    token_file: str | None = getattr(args, "token_file", None)
    token: str | None = None
    token_from = ""
    choice = choose_config(getattr(args, "config", None), env)
    if choice.path is not None:
        from supervisor.common.apitoken import load_token
        from supervisor.common.configerror import ConfigError

        try:
            api, notes = api_settings(choice.path)
            for note in notes:
                print(f"note: {note}", file=sys.stderr)
            if url is None:
                url = f"http://{_connect_host(api.host)}:{api.port}"
            if token_file is None:
                token = load_token(api, env, client=True)
                if api.token_file:
                    token_from = f"[api] token_file {api.token_file} (of {choice.path})"
                elif token is not None:
                    token_from = f"${api.token_env} (named by [api] token_env of {choice.path})"
        except (ClientConfigError, ConfigError) as err:
            where = "--config" if getattr(args, "config", None) else (CONFIG_ENV if choice.explicit else "config")
            raise UsageError(f"{where}: {err}") from None
    if token_file:
        token = _token(token_file, env)
        token_from = f"--token-file {token_file}"
    elif token is None:
        token = _token(None, env)
        token_from = f"${TOKEN_ENV}" if token is not None else ""
    if token is None:
        token_from = f"no token was sent (no --token-file, no [api] token_file, ${TOKEN_ENV} unset)"
    if getattr(args, "url", None):
        where = "from --url"
    elif choice.path is not None:
        where = f"from [api] of {choice.path}"
    else:
        where = f"the default: no --url, no --config, ${CONFIG_ENV} unset and no /etc/sglang-supervisor/config.toml"
    return url or DEFAULT_URL, token, where, token_from


def _connect_host(host: str) -> str:
    """Where to connect for a daemon bound to `host` (a wildcard bind answers on loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _default_timeout(command: str) -> float:
    return DIAGNOSE_TIMEOUT_S if command == "diagnose" else DEFAULT_TIMEOUT_S


def _token(token_file: str | None, env: Mapping[str, str]) -> str | None:
    if token_file:
        from supervisor.common.apitoken import read_token_file
        from supervisor.common.configerror import ConfigError

        try:  # the daemon's own rules: a regular file, ours (or, for root, the service user's), private
            return read_token_file(Path(token_file), f"--token-file {token_file}", client=True)
        except ConfigError as err:
            raise UsageError(str(err)) from None
    return env.get(TOKEN_ENV, "").strip() or None


def _stream_params(command: str, args: argparse.Namespace) -> list[tuple[str, str]]:
    if command == "logs":
        if args.previous and args.follow:
            raise UsageError("logs --previous --follow: the previous launch has ended; leave out --follow")
        previous = [("launch", "previous")] if args.previous else []
        shown = [("all", "true")] if args.all else []
        return [("lines", str(args.lines)), *previous, *shown] + ([("follow", "true")] if args.follow else [])
    return _request_for(command, args)[3] + [("follow", "true")]


def _request_for(
    command: str, args: argparse.Namespace
) -> tuple[str, str, dict[str, object] | None, list[tuple[str, str]]]:
    if command == "status":
        return "GET", "/status", None, []
    if command == "restart":
        body: dict[str, object] = {"reason": args.reason, "diagnose": args.diagnose}
        if args.rung:
            body["rung"] = args.rung
        return "POST", "/restart", body, []
    if command == "diagnose":
        body = {k: v for k, v in (("native", args.native), ("gdb", args.gdb)) if v is not None}
        return "POST", "/diagnose", body, []
    if command == "events":
        params = [("limit", str(args.limit))] + [("event", e) for e in args.event or ()]
        if args.since:
            params.append(("since", _since(args.since)))
        return "GET", "/events", None, params
    if command == "bundles":
        return "GET", "/diagnostics", None, []
    if command == "stop" and args.reason:
        return "POST", "/stop", {"reason": args.reason}, []
    if command == "promote":
        return "POST", "/promote", {"reason": args.reason} if args.reason else {}, []
    if command == "start" and args.rung:
        return "POST", "/start", {"rung": args.rung}, []
    return "POST", f"/{command}", None, []


_RELATIVE = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _since(text: str, now: datetime | None = None) -> str:
    """An ISO time as the API takes it (with an offset); a time without one is UTC; `30m`, `1h`,
    `2d`, `90s` are that long before now."""
    t = text.strip().lower()
    if len(t) >= 2 and t[-1] in _RELATIVE and t[:-1].replace(".", "", 1).isdigit():
        at = (now or datetime.now(timezone.utc)) - timedelta(seconds=float(t[:-1]) * _RELATIVE[t[-1]])
        return at.isoformat()
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--since {text!r}: not a time; give an ISO-8601 time (2026-11-30T12:00:00Z) or a span back from now "
            "(90s, 30m, 1h, 2d)"
        ) from None
    return (at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)).isoformat()


def _send(
    url: str,
    method: str,
    path: str,
    body: dict[str, object] | None,
    token: str | None,
    timeout: float,
    params: list[tuple[str, str]] | None = None,
) -> httpx.Response:
    # A non-simple header: the daemon refuses a state-changing request a web page could send (api/browser.py).
    headers = {"Accept": "application/json", "X-Requested-By": "sglang-supervisor"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with httpx.Client(
            base_url=url.rstrip("/"), timeout=timeout, headers=headers, trust_env=False, follow_redirects=False
        ) as client:
            return client.request(method, path, json=body, params=tuple(params or ()))
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as err:
        raise UsageError(f"--url {url!r}: {err}") from None


def _show_bundle(
    url: str, bundle_id: str, token: str | None, timeout: float, *, as_json: bool, utc: bool = False
) -> int:
    """One bundle: its summary.txt (what a person reads first) and its files."""
    detail = _send(url, "GET", f"/diagnostics/{bundle_id}", None, token, timeout)
    if as_json or detail.status_code != 200:
        return report("bundles", detail, as_json=as_json, out=sys.stdout, err=sys.stderr)
    data: Any = detail.json()
    text = ""
    if "summary.txt" in (data.get("files") or ()):
        answer = _send(url, "GET", f"/diagnostics/{bundle_id}/summary.txt", None, token, timeout)
        if answer.status_code == 200:
            text = answer.text.rstrip()
    print(format_bundle(data, text, utc))
    return EXIT_OK


def _ours(response: httpx.Response, data: Any) -> bool:
    """Whether the answer has this daemon's shape: a JSON object, with `error` when it is one."""
    if not isinstance(data, (dict, list)):
        return False
    return response.status_code < 400 or (isinstance(data, dict) and "error" in data)


def _foreign(response: httpx.Response) -> str:
    """What answered instead of the daemon, and what to do: SGLang itself (its /get_model_info
    answers) is the usual mistake, a port away from the daemon's."""
    url = response.request.url
    base = f"{url.scheme}://{url.netloc.decode()}"
    head = f"HTTP {response.status_code} from {url} is not a sglang-supervisor answer"
    fix = "point the client at the daemon's [api] port (default 8900) with --url or --config"
    try:
        info = httpx.get(f"{base}/get_model_info", timeout=3.0, trust_env=False)
        model = info.json().get("model_path") if info.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        model = None
    if model:
        return f"{head}: {base} is SGLang's own server (model {model}), not its supervisor; {fix}"
    return f"{head}: is something else listening at {base}? {fix}"


def _get_bundle(url: str, words: list[str], output: str | None, token: str | None, timeout: float) -> int:
    """`bundles get ID [FILE]`: one file (to ./FILE, or stdout with `-o -`), or every file of the
    bundle into ./ID/ (or `-o DIR`), a directory this call creates; what exists already is not
    overwritten. The file names come from the daemon's answer: only plain names are taken, and each
    file is created new without following a link (supervisor/client/savefiles.py, issue 50)."""
    if not words or len(words) > 2:
        raise UsageError(
            "bundles get ID [FILE]: name the bundle (see `sglang-supervisor bundles`) and optionally a file"
        )
    bundle_id, name = words[0], (words[1] if len(words) == 2 else None)
    for word in (bundle_id, name):
        if word is not None and not savefiles.plain_name(word):
            raise UsageError(f"bundles get: {word!r} is not a bundle or file name (no '/', '..' or control characters)")
    detail = _send_here(url, f"/diagnostics/{quote(bundle_id, safe='')}", token, timeout)
    if detail.status_code != 200:
        return _not_saved(detail)
    try:
        listed: Any = detail.json().get("files")
    except (ValueError, AttributeError):
        listed = None
    if not isinstance(listed, list):
        print(f"error: {_foreign(detail)}", file=sys.stderr)
        return EXIT_ERROR
    bad = [f for f in listed if not savefiles.plain_name(f)]
    if bad:
        print(
            f"error: the answer for bundle {bundle_id} names {bad[0]!r}, not a plain file name; nothing written "
            "(is something else answering at this address?)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    files = [str(f) for f in listed]
    if name is not None and name not in files:
        print(f"error: bundle {bundle_id} has no file {name!r}; it has: {', '.join(files) or 'none'}", file=sys.stderr)
        return EXIT_ERROR
    if name is not None and output == "-":
        answer = _send_here(url, f"/diagnostics/{quote(bundle_id, safe='')}/{quote(name, safe='')}", token, timeout)
        if answer.status_code != 200:
            return _not_saved(answer)
        sys.stdout.buffer.write(answer.content)
        sys.stdout.flush()
        return EXIT_OK
    if name is not None:
        dest = Path(output) if output else Path(name)
        return _save_one(url, bundle_id, name, dest, token, timeout)
    where = Path(output) if output else Path(bundle_id)
    try:
        dir_fd = savefiles.make_private_dir(where)
    except FileExistsError:
        print(f"error: {where} exists; not overwritten (choose another place with -o)", file=sys.stderr)
        return EXIT_ERROR
    except OSError as err:
        print(f"error: cannot create {where}: {err.strerror or err}", file=sys.stderr)
        return EXIT_ERROR
    try:
        for f in files:
            answer = _send_here(url, f"/diagnostics/{quote(bundle_id, safe='')}/{quote(f, safe='')}", token, timeout)
            if answer.status_code != 200:
                return _not_saved(answer)
            try:
                savefiles.write_new(f, answer.content, dir_fd=dir_fd)
            except OSError as err:
                print(f"error: {where / f} not written: {err.strerror or err}", file=sys.stderr)
                return EXIT_ERROR
            print(f"{where / f} ({len(answer.content)} bytes)")
    finally:
        os.close(dir_fd)
    return EXIT_OK


def _save_one(url: str, bundle_id: str, name: str, dest: Path, token: str | None, timeout: float) -> int:
    """One file of a bundle to `dest` (the operator's choice of place), created new, no link followed."""
    if dest.exists() or dest.is_symlink():
        print(f"error: {dest} exists; not overwritten (choose another place with -o)", file=sys.stderr)
        return EXIT_ERROR
    answer = _send_here(url, f"/diagnostics/{quote(bundle_id, safe='')}/{quote(name, safe='')}", token, timeout)
    if answer.status_code != 200:
        return _not_saved(answer)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        savefiles.write_new(str(dest), answer.content)
    except FileExistsError:
        print(f"error: {dest} exists; not overwritten (choose another place with -o)", file=sys.stderr)
        return EXIT_ERROR
    except OSError as err:
        print(f"error: {dest} not written: {err.strerror or err}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{dest} ({len(answer.content)} bytes)")
    return EXIT_OK


def _send_here(url: str, path: str, token: str | None, timeout: float) -> httpx.Response:
    """A GET that carries the token only to the configured address: a URL whose scheme, host or
    port is not the configured one is refused before anything is sent, and a redirect is never
    followed (`_not_saved` reports it)."""
    target = httpx.URL(url.rstrip("/") + path)
    if not _same_origin(url, target):
        raise UsageError(f"refused: {path!r} would go to {target}, not to {url}; the token goes nowhere else")
    return _send(url, "GET", path, None, token, timeout)


def _not_saved(answer: httpx.Response) -> int:
    """An answer other than 200 to a download: a redirect is refused (the token is not sent on), the
    rest reported as the daemon's error or a foreign answer."""
    if answer.is_redirect:
        where = answer.headers.get("location", "?")
        print(
            f"error: {answer.request.url} answered a redirect ({answer.status_code}) to {where!r}; not followed: "
            "the token goes only to the configured address",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return report("bundles", answer, as_json=False, out=sys.stdout, err=sys.stderr)


def _same_origin(configured: str, sent: httpx.URL) -> bool:
    base = httpx.URL(configured)
    return (base.scheme, base.host, base.port) == (sent.scheme, sent.host, sent.port)


def _transport_reason(err: Exception) -> str:
    if isinstance(err, httpx.TimeoutException):
        return "no answer in time (raise --timeout)"
    return str(err) or type(err).__name__


def report(
    command: str,
    response: httpx.Response,
    *,
    as_json: bool,
    out: TextIO,
    err: TextIO,
    token_from: str = "",
    utc: bool = False,
) -> int:
    """Print the daemon's answer (or its error) and return the exit code."""
    try:
        data: Any = response.json()
    except ValueError:
        data = None
    if not _ours(response, data):
        print(f"error: {_foreign(response)}", file=err)
        return EXIT_AUTH if response.status_code == 401 else EXIT_ERROR
    http = _exit_code(response.status_code)
    code = http
    if http == EXIT_OK and command == "status" and isinstance(data, dict):
        code = status_exit(data)  # by state, as `systemctl is-active`; 10 on a fallback rung
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=False), file=out)
        return code
    if http != EXIT_OK:
        print(format_error(response.status_code, data, token_from), file=err)
        return code
    print(format_answer(command, data, utc=utc), file=out)
    return code


def _exit_code(status: int) -> int:
    if status == 401:
        return EXIT_AUTH
    return EXIT_OK if 200 <= status < 300 else EXIT_ERROR
