"""How the client prints the daemon's answers for a person (`--json` prints them as they are)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from supervisor.client.groupformat import group_rows
from supervisor.status.timetext import duration, when
from supervisor.status.wording import restarts_text

TOKEN_ENV = "SGLANG_SUPERVISOR_TOKEN"
# The answer's fields that hold a moment: shown in the host's zone with the offset, or UTC (--utc).
TIME_KEYS = frozenset({"ts", "at", "since", "started_at", "created_at", "last_failed_at", "last_ok_at"})


def zoned(data: Any, utc: bool = False) -> Any:
    """`data` with every moment (a TIME_KEYS field that reads as a time) in the one format, in the
    host's local zone or UTC (supervisor/status/timetext.py); the rest as it is."""
    if isinstance(data, Mapping):
        return {
            k: when(v, utc=utc) if k in TIME_KEYS and isinstance(v, str) and v else zoned(v, utc)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [zoned(v, utc) for v in data]
    return data


def format_error(status: int, data: Any, token_from: str = "") -> str:
    """The daemon's error in one line (and a hint); `token_from`: where the token sent was read, said
    on a 401 so a person knows which file (or variable) holds the wrong one."""
    if not isinstance(data, dict):
        return f"error: HTTP {status}"
    detail = data.get("detail")
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" for d in detail)
    line = f"error: HTTP {status} {data.get('error', '')}: {detail}"
    if data.get("state"):
        line += f" [state: {data['state']}]"
    if data.get("rungs") and not all(r in str(detail) for r in data["rungs"]):  # the detail may list them
        line += f"\nrungs: {', '.join(data['rungs'])}"
    if status == 401:
        if token_from.startswith("no token"):
            line += f"\nhint: {token_from}; pass --token-file FILE or set {TOKEN_ENV}"
        elif token_from:
            line += f"\nhint: the token sent was read from {token_from}, and this daemon refused it; "
            line += f"pass --token-file FILE or set {TOKEN_ENV} to the daemon's token"
        else:
            line += f"\nhint: pass --token-file FILE or set {TOKEN_ENV}"
    return line


def format_answer(command: str, data: Any, *, waiting: bool = False, utc: bool = False) -> str:
    """The answer to a command in words; `waiting`: `--wait` was given, so no hint to pass it;
    `utc`: moments in UTC instead of the host's zone."""
    data = zoned(data, utc)  # idempotent: the formatters below zone again with the same `utc`
    if command == "status":
        return format_status(data, utc)
    if command == "restart":
        # The answer's state is the one before the restart: not the result, so it is not shown.
        inc = f"incident {data['incident_id']}" if data.get("incident_id") else "no incident (nothing was running)"
        if waiting:
            return f"restart accepted: {inc}; waiting for it"
        return f"restart accepted: {inc}; follow it with `status --watch`, or pass --wait"
    if command == "diagnose":
        return format_diagnose(data)
    if command == "events":
        return "\n".join(format_event(e, utc) for e in data.get("events") or ()) or "no events"
    if command == "bundles":
        return "\n".join(format_bundle_line(b) for b in data.get("bundles") or ()) or "no bundles"
    if command == "reload":
        return f"reload: {data.get('message') or 'done'} (state {data.get('state') or '-'})"
    message = data.get("message")
    if command in ("stop", "start"):
        already = str(message or "").startswith("already ")
        hint = "" if already else "; waiting for it" if waiting else "; --wait waits for it"
        return f"{command} accepted ({message or {'stop': 'stopping', 'start': 'starting'}[command]}){hint}"
    return f"{command} accepted: state {data.get('state') or '-'}" + (f" ({message})" if message else "")


def format_diagnose(data: Mapping[str, Any]) -> str:
    """The bundle, whether the server was hung, and what each tool did or why it did not run."""
    s: Mapping[str, Any] = data.get("summary") or {}
    lines = [f"bundle {data.get('bundle_id') or '-'}"]
    hung = data.get("hung", s.get("trigger") == "hung")
    for key in ("trigger", "cause", "rung", "phase", "created_at"):
        if s.get(key) is not None:
            lines.append(f"  {key}: {s[key]}")
    if hung:
        lines.append(f"  hang_class: {s.get('hang_class') or 'unknown'}")
    else:
        lines.append(
            f"  not hung (state {data.get('state') or '-'}): no hang class; summary.txt shows where threads wait"
        )
    lines += _tool_lines(s.get("tools") or ())
    if data.get("bundle_id"):
        lines.append(
            f"files: GET /diagnostics/{data['bundle_id']}  (or: sglang-supervisor bundles {data['bundle_id']})"
        )
    return "\n".join(lines)


def _tool_lines(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per tool and outcome, e.g. `py-spy-native: skipped for 3 processes (why)`."""
    groups: dict[tuple[str, str, str], int] = {}
    for t in tools:
        if not isinstance(t, Mapping):
            continue
        why = "" if t.get("outcome") == "ok" else str(t.get("detail") or "")
        key = (str(t.get("tool")), str(t.get("outcome")), why)
        groups[key] = groups.get(key, 0) + 1
    lines = []
    for (tool, outcome, why), n in groups.items():
        text = f"  {tool}: {outcome} for {n} process{'es' if n > 1 else ''}"
        lines.append(text + (f" ({why})" if why else ""))
    return lines


def format_event(e: Mapping[str, Any], utc: bool = False) -> str:
    e = zoned(e, utc)
    rest = " ".join(f"{k}={_short(v)}" for k, v in e.items() if k not in ("ts", "event") and v not in (None, "", []))
    return f"{e.get('ts', '-')}  {e.get('event', '?')}  {rest}".rstrip()


def _short(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    text = text.replace("\n", " ")
    return repr(text) if " " in text else text


def format_bundle_line(b: Mapping[str, Any]) -> str:
    s: Mapping[str, Any] = b.get("summary") or {}
    what = s.get("cause") or s.get("trigger") or "-"
    return f"{b.get('id')}  {what}  {s.get('hang_class') or '-'}  rung {s.get('rung') or '-'}"


def format_bundle(data: Mapping[str, Any], summary_txt: str, utc: bool = False) -> str:
    data = zoned(data, utc)
    s: Mapping[str, Any] = data.get("summary") or {}
    lines = [f"bundle {data.get('id')}"]
    for key in ("created_at", "trigger", "cause", "hang_class", "rung", "phase"):
        if s.get(key) is not None:
            lines.append(f"  {key}: {s[key]}")
    if summary_txt:
        lines += ["", summary_txt, ""]
    lines.append("files: " + ", ".join(data.get("files") or ()))
    lines.append(f"read one: GET /diagnostics/{data.get('id')}/<file>")
    return "\n".join(lines)


def _age(seconds: float | None) -> str:
    """A duration: `12.0 s`, `3 min 10 s`, `2 h 5 min` (supervisor/status/timetext.py)."""
    if seconds is None:
        return "-"
    return f"{seconds:.1f} s" if seconds < 60 else duration(seconds)


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
    engines: Sequence[str] = s.get("ladder_engines") or ()
    if s.get("engine") and len(set(engines)) > 1:  # a ladder that crosses engines says which runs
        rung += f" [{s['engine']}]"
    if s.get("rung_index") is not None and ladder:
        named = [
            f"{n} [{engines[i]}]" if len(set(engines)) > 1 and i < len(engines) else n for i, n in enumerate(ladder)
        ]
        rung += f" (#{s['rung_index']} of {len(ladder)}: {', '.join(named)})"
    if s.get("last_good_rung"):
        rung += f"; last good {s['last_good_rung']}"
    pid = str(s.get("pid") or "-") + (" (adopted from an earlier daemon)" if s.get("adopted") else "")
    rows += [("rung", rung), ("pid", pid)]
    index = s.get("rung_index")
    if s.get("state") in ("ready", "degraded") and isinstance(index, int) and index > 0 and ladder:
        rows.append(("fallback", _fallback_text(s, ladder)))
    rows += _ready_rows(s)
    rows.append(("restarts", restarts_text(s.get("restarts", 0), s.get("restarts_last_hour", 0))))
    rows.append(("incidents", f"{s.get('incidents', 0)} since the daemon started (bundles: sglang-supervisor bundles)"))
    if s.get("last_progress_s") is not None:  # start-up progress: the daemon leaves it out while serving
        moved = ", ".join(s.get("channels_moved") or ())
        since = _age(s.get("last_progress_s"))
        rows.append(("last progress", f"{since} ago ({moved})" if moved else f"{since} ago"))
    inc = s.get("last_incident")
    if inc:
        text = f"{inc.get('cause')}"
        if inc.get("hang_class"):
            text += f" / {inc['hang_class']}"
        text += f" at {inc.get('at')} on {inc.get('rung')}"
        if inc.get("bundle"):
            text += f", bundle {inc['bundle']}"
        rows.append(("last incident", text))
        if inc.get("detail"):
            rows.append(("", f"why: {inc['detail']}"))
        if inc.get("culprit"):
            rows.append(("", str(inc["culprit"])))
    else:
        rows.append(("last incident", "-"))
    if s.get("state") in ("ready", "degraded", "starting", "hung", "diagnosing"):
        rows.append(("serving", _serving(s.get("serving") or {})))
    rows += _problems(s)
    rows += _gpus(s.get("gpu") or {})
    if s.get("next_attempt_in_s") is not None:
        rows.append(("next attempt", f"in {_age(s['next_attempt_in_s'])}"))
    if s.get("diagnosing"):
        rows.append(("diagnosing", "a capture is under way"))
    rows += group_rows(s.get("group"))
    return rows


def _ready_rows(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Launch-to-ready (a load) and, for an adopted server, the takeover (no load): never mixed up."""
    rows = []
    if s.get("takeover_s") is not None:
        rows.append(("taken over", f"ready {_age(s['takeover_s'])} after the daemon adopted it (no reload)"))
    if s.get("time_to_ready_s") is not None:
        rows.append(("ready in", f"{_age(s['time_to_ready_s'])} from launch"))
    return rows


def _problems(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What is wrong with the daemon itself: missing evidence tools, failed writes, caught errors."""
    rows = []
    unusable = [c for c in s.get("selfcheck") or () if isinstance(c, Mapping) and not c.get("ok")]
    absent = [c for c in unusable if c.get("kind") == "capability"]  # what this GPU cannot do: no fault
    optional = [c for c in unusable if "(optional" in str(c.get("detail"))]  # cuda-gdb off a GPU host
    bad = [c for c in unusable if c not in optional and c not in absent]
    if bad:
        text = "; ".join(f"{c.get('name')}: {c.get('detail') or 'not usable'}" for c in bad)
        rows.append(("self-check", f"FAILED {text} (bundles will lack these stacks)"))
    if optional:
        rows.append(("optional", ", ".join(f"{c.get('name')} not installed" for c in optional)))
    for c in absent:
        instead = f"; the daemon uses {c['instead']} instead" if c.get("instead") else ""
        rows.append(("unavailable", f"{c.get('name')} not available here: {c.get('detail')}{instead}"))
    for n in s.get("notifications") or ():
        if isinstance(n, Mapping) and (n.get("failed") or n.get("dropped")):
            text = f"{n.get('target')}: {n.get('failed', 0)} failed, {n.get('dropped', 0)} dropped, {n.get('ok', 0)} ok"
            text += f" since the daemon started; last: {n.get('last_error')} at {n.get('last_failed_at')}"
            rows.append(("notify FAILING", text + " (events --event notification)"))
    w = s.get("write_errors") or {}
    failed = {k: v for k, v in w.items() if isinstance(v, int) and v > 0} if isinstance(w, Mapping) else {}
    if failed:
        text = ", ".join(f"{k} {v}" for k, v in failed.items())
        rows.append(("write errors", f"{text} (disk full or state_dir not writable? see the daemon's log)"))
    if s.get("loop_errors"):
        hint = "sglang-supervisor events --event loop_error"
        rows.append(("loop errors", f"{s['loop_errors']} caught and survived ({hint})"))
    stop = s.get("last_stop")
    if isinstance(stop, Mapping) and (stop.get("gpu_released") == "held" or stop.get("port_free") is False):
        text = f"at {stop.get('at')}: GPU {stop.get('gpu_released')}, port free {stop.get('port_free')}"
        rows.append(("last stop", text))
    return rows


def _serving(v: Mapping[str, Any]) -> str:
    parts = []
    if v.get("health_ok") is not None:
        health = "health ok" if v["health_ok"] else f"health FAILING ({v.get('health_failures_in_row', 0)} in a row)"
        if v.get("health_latency_s") is not None:
            health += f" {1000 * float(v['health_latency_s']):.0f} ms"
        parts.append(health)
    stale = bool(v.get("stale"))
    for key, label in (("running_reqs", "running"), ("queue_reqs", "queued")):
        if v.get(key) is not None:
            parts.append(f"{float(v[key]):g} {label}")
    if stale:
        # SGLang's gauges keep their last value when the scheduler stops: say how old they are.
        parts.append(f"STALLED: no token for {_age(v.get('tokens_moved_s'))} (running/queued are frozen figures)")
    elif v.get("token_rate") is not None:
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


def format_status(s: Any, utc: bool = False) -> str:
    if not isinstance(s, Mapping):
        return json.dumps(s)
    rows = _rows(zoned(s, utc))
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)


def _fallback_text(s: Mapping[str, Any], ladder: Sequence[str]) -> str:
    """Serving on a fallback rung, said as its own condition (issue 38): why the preferred rung is
    not in use and what tries it again."""
    text = f"serving on fallback rung {s.get('rung')}, not the preferred {ladder[0]}"
    if s.get("started_at"):
        text += f", since {s['started_at']}"
    inc = s.get("last_incident")
    if isinstance(inc, Mapping) and inc.get("cause"):
        text += f"; last failure {inc['cause']}" + (f"/{inc['hang_class']}" if inc.get("hang_class") else "")
        text += f" on {inc.get('rung')} at {inc.get('at')}"
    return text + f"; `sglang-supervisor promote` tries {ladder[0]} now"
