"""Client commands against a running daemon: `status`, `restart`, `stop`, `start`, `diagnose`.

Exit codes scripts can trust: 0 done, 1 the daemon answered with an error, 2 usage (bad
arguments, unreadable token file, bad URL), 3 the daemon could not be reached or did not answer
in time, 4 the daemon refused the token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import httpx

DEFAULT_URL = "http://127.0.0.1:8900"
TOKEN_ENV = "SGLANG_SUPERVISOR_TOKEN"
COMMANDS = ("status", "restart", "stop", "start", "diagnose")
DEFAULT_TIMEOUT_S = 15.0
# A capture runs py-spy over every process and gdb over a hung tree: minutes, not seconds.
DIAGNOSE_TIMEOUT_S = 600.0

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_AUTH = 0, 1, 2, 3, 4


class _UsageError(Exception):
    pass


def add_client_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the client commands; `run_client` runs whichever was chosen."""
    helps = {
        "status": "show the supervisor's state, rung, progress, last incident, serving and GPUs",
        "restart": "restart the server now (stop, verify release, relaunch)",
        "stop": "stop the server and keep it stopped",
        "start": "start the server after a stop or out of failed",
        "diagnose": "capture evidence now (py-spy, optionally gdb) and print the bundle",
    }
    for name in COMMANDS:
        p = subparsers.add_parser(name, help=helps[name], description=helps[name])
        p.add_argument("--url", default=DEFAULT_URL, help=f"the daemon's API (default {DEFAULT_URL})")
        p.add_argument("--token-file", help=f"file holding the API token (default: ${TOKEN_ENV} if set)")
        p.add_argument("--json", action="store_true", help="print the daemon's JSON answer as it is")
        p.add_argument("--timeout", type=float, help="seconds to wait for the answer")
        if name == "restart":
            p.add_argument("--rung", help="go straight to this rung of the ladder")
            p.add_argument("--reason", default="", help="recorded with the incident")
            p.add_argument("--diagnose", action="store_true", help="capture evidence before stopping")
        if name == "diagnose":
            p.add_argument("--native", action=argparse.BooleanOptionalAction, help="py-spy --native")
            p.add_argument("--gdb", action=argparse.BooleanOptionalAction, help="also take gdb backtraces")
        p.set_defaults(client_command=name)


def run_client(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    command = getattr(args, "client_command", None) or getattr(args, "command", None)
    if command not in COMMANDS:
        print(f"error: unknown client command {command!r}", file=sys.stderr)
        return EXIT_USAGE
    try:
        token = _token(args.token_file, os.environ if env is None else env)
        method, path, body = _request_for(command, args)
        timeout = args.timeout if args.timeout is not None else _default_timeout(command)
        response = _send(args.url, method, path, body, token, timeout)
    except _UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except (httpx.TimeoutException, httpx.TransportError) as err:
        print(f"error: cannot reach the daemon at {args.url}: {_transport_reason(err)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    return _report(command, response, as_json=args.json, out=sys.stdout, err=sys.stderr)


def _default_timeout(command: str) -> float:
    return DIAGNOSE_TIMEOUT_S if command == "diagnose" else DEFAULT_TIMEOUT_S


def _token(token_file: str | None, env: Mapping[str, str]) -> str | None:
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise _UsageError(
                f"cannot read --token-file {token_file}: {getattr(err, 'strerror', None) or err}"
            ) from None
        if not token:
            raise _UsageError(f"--token-file {token_file} is empty")
        return token
    return env.get(TOKEN_ENV, "").strip() or None


def _request_for(command: str, args: argparse.Namespace) -> tuple[str, str, dict[str, object] | None]:
    if command == "status":
        return "GET", "/status", None
    if command == "restart":
        body: dict[str, object] = {"reason": args.reason, "diagnose": args.diagnose}
        if args.rung:
            body["rung"] = args.rung
        return "POST", "/restart", body
    if command == "diagnose":
        body = {k: v for k, v in (("native", args.native), ("gdb", args.gdb)) if v is not None}
        return "POST", "/diagnose", body
    return "POST", f"/{command}", None


def _send(
    url: str, method: str, path: str, body: dict[str, object] | None, token: str | None, timeout: float
) -> httpx.Response:
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with httpx.Client(base_url=url.rstrip("/"), timeout=timeout, headers=headers, trust_env=False) as client:
            return client.request(method, path, json=body)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as err:
        raise _UsageError(f"--url {url!r}: {err}") from None


def _transport_reason(err: Exception) -> str:
    if isinstance(err, httpx.TimeoutException):
        return "no answer in time (raise --timeout)"
    return str(err) or type(err).__name__


def _report(command: str, response: httpx.Response, *, as_json: bool, out: TextIO, err: TextIO) -> int:
    try:
        data: Any = response.json()
    except ValueError:
        print(
            f"error: HTTP {response.status_code} from {response.request.url} is not a sglang-supervisor answer",
            file=err,
        )
        return EXIT_AUTH if response.status_code == 401 else EXIT_ERROR
    code = _exit_code(response.status_code)
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=False), file=out)
        return code
    if code != EXIT_OK:
        print(format_error(response.status_code, data), file=err)
        return code
    print(format_answer(command, data), file=out)
    return code


def _exit_code(status: int) -> int:
    if status == 401:
        return EXIT_AUTH
    return EXIT_OK if 200 <= status < 300 else EXIT_ERROR


def format_error(status: int, data: Any) -> str:
    if not isinstance(data, dict):
        return f"error: HTTP {status}"
    detail = data.get("detail")
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" for d in detail)
    line = f"error: HTTP {status} {data.get('error', '')}: {detail}"
    if data.get("state"):
        line += f" [state: {data['state']}]"
    if data.get("rungs"):
        line += f"\nrungs: {', '.join(data['rungs'])}"
    if status == 401:
        line += f"\nhint: pass --token-file FILE or set {TOKEN_ENV}"
    return line


def format_answer(command: str, data: Any) -> str:
    if command == "status":
        return format_status(data)
    if command == "restart":
        return f"restart accepted: incident {data.get('incident_id') or '-'}, state {data.get('state') or '-'}"
    if command == "diagnose":
        lines = [f"bundle {data.get('bundle_id') or '-'}"]
        for key, value in (data.get("summary") or {}).items():
            if not isinstance(value, (dict, list)):
                lines.append(f"  {key}: {value}")
        if data.get("bundle_id"):
            lines.append(f"files: GET /diagnostics/{data['bundle_id']}")
        return "\n".join(lines)
    return f"{command} accepted: state {data.get('state') or '-'}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _rows(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    state = str(s.get("state", "?"))
    if s.get("state_age_s"):
        state += f" for {_age(s['state_age_s'])}"
    elif s.get("since"):
        state += f" since {s['since']}"
    if s.get("reason"):
        state += f" ({s['reason']})"
    rows = [("state", state), ("phase", s.get("phase") or "-")]
    p = s.get("progress")
    if p:
        text = f"{p.get('done')}/{p.get('total')} {p.get('unit', '')} {p.get('label', '')}".strip()
        text += f" ({100 * float(p.get('fraction', 0)):.1f}%)"
        rows.append(("progress", text))
    else:
        rows.append(("progress", "-"))
    ladder: Sequence[str] = s.get("ladder") or ()
    rung = str(s.get("rung") or "-")
    if s.get("rung_index") is not None and ladder:
        rung += f" (#{s['rung_index']} of {len(ladder)}: {', '.join(ladder)})"
    if s.get("last_good_rung"):
        rung += f"; last good {s['last_good_rung']}"
    rows += [("rung", rung), ("pid", str(s.get("pid") or "-"))]
    rows.append(("restarts", f"{s.get('restarts', 0)} ({s.get('restarts_last_hour', 0)} in the last hour)"))
    moved = ", ".join(s.get("channels_moved") or ())
    since = _age(s.get("last_progress_s"))
    rows.append(("last progress", f"{since} ago ({moved})" if moved else (f"{since} ago" if since != "-" else "-")))
    inc = s.get("last_incident")
    if inc:
        text = f"{inc.get('cause')}"
        if inc.get("hang_class"):
            text += f" / {inc['hang_class']}"
        text += f" at {inc.get('at')} on {inc.get('rung')}"
        if inc.get("bundle"):
            text += f", bundle {inc['bundle']}"
        rows.append(("last incident", text))
    else:
        rows.append(("last incident", "-"))
    rows.append(("serving", _serving(s.get("serving") or {})))
    rows += _gpus(s.get("gpu") or {})
    if s.get("next_attempt_in_s") is not None:
        rows.append(("next attempt", f"in {_age(s['next_attempt_in_s'])}"))
    if s.get("diagnosing"):
        rows.append(("diagnosing", "a capture is under way"))
    return rows


def _serving(v: Mapping[str, Any]) -> str:
    parts = []
    if v.get("health_ok") is not None:
        health = "health ok" if v["health_ok"] else f"health FAILING ({v.get('health_failures_in_row', 0)} in a row)"
        if v.get("health_latency_s") is not None:
            health += f" {1000 * float(v['health_latency_s']):.0f} ms"
        parts.append(health)
    for key, label in (("running_reqs", "running"), ("queue_reqs", "queued")):
        if v.get(key) is not None:
            parts.append(f"{float(v[key]):g} {label}")
    if v.get("token_rate") is not None:
        parts.append(f"{float(v['token_rate']):.0f} tok/s")
    if v.get("spec_accept_length") is not None:
        parts.append(f"spec accept {float(v['spec_accept_length']):.2f}")
    return ", ".join(parts) or "-"


def _gpus(g: Mapping[str, Any]) -> list[tuple[str, str]]:
    devices = g.get("devices") or []
    if not devices:
        reason = g.get("reason") or g.get("status") or "-"
        return [("GPUs", str(reason))]
    rows: list[tuple[str, str]] = []
    for d in devices:
        text = (
            f"#{d.get('index')} {d.get('name', '')}  {float(d.get('util_percent', 0)):.0f}% util  "
            f"{_gib(d.get('mem_used_bytes', 0))}/{_gib(d.get('mem_total_bytes', 0))}"
        )
        if d.get("tree_mem_bytes"):
            text += f" (server {_gib(d['tree_mem_bytes'])})"
        rows.append(("GPUs" if not rows else "", text))
    return rows


def format_status(s: Any) -> str:
    if not isinstance(s, Mapping):
        return json.dumps(s)
    rows = _rows(s)
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)
