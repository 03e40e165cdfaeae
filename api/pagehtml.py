"""The status page's HTML, rendered on the server from typed records (pure: no I/O, no clock).

No script, no external resource: inline CSS and an inline SVG chart, so the page works on an
offline GPU host, saved with curl, and under a `default-src 'none'` content security policy. Every
value from the server (log lines, reasons) is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from api import promote
from api.pageforms import action_bar, action_form
from api.pagelaunch import launch_section
from supervisor.status.snapshot import StatusSnapshot
from supervisor.status.timeline import TimelinePoint
from supervisor.status.timetext import ago, duration, when
from supervisor.status.wording import restarts_text

# Each state its colour; hung and failed are red (failed the darker), as an operator expects.
STATE_COLOURS = {
    "ready": "#1a7f37",
    "degraded": "#bf8700",
    "starting": "#0969da",
    "hung": "#cf222e",
    "diagnosing": "#8250df",
    "restarting": "#bc4c00",
    "failed": "#82071e",
    "stopped": "#6e7781",
}
FALLBACK_COLOUR = "#d4a72c"  # amber: serving, but not on the preferred rung
CHANNELS = ("log", "progress", "phase", "cpu", "io", "rss", "gpu_mem", "port")
REFRESH_S = 5

CSS = """
body{margin:0;font:14px/1.4 system-ui,sans-serif;color:#1f2328;background:#fff}
header{display:flex;flex-wrap:wrap;align-items:center;gap:16px;padding:0 16px 0 0;border-bottom:1px solid #d0d7de}
#state{min-width:220px;height:64px;box-sizing:border-box;padding:0 16px;display:flex;align-items:center;
 justify-content:center;color:#fff;font-size:22px;font-weight:600;text-transform:uppercase;letter-spacing:1px;
 white-space:nowrap;flex:none}
main{padding:8px 16px;display:grid;grid-template-columns:1fr 1fr;gap:8px 24px}
section{min-width:0} h2{font-size:15px;margin:12px 0 4px} .wide{grid-column:1/3}
table{border-collapse:collapse;width:100%} td,th{text-align:left;padding:2px 6px;border-bottom:1px solid #eaeef2;
 vertical-align:top} th{font-weight:600;color:#57606a}
.cur{font-weight:700} .tag{font-size:11px;padding:0 6px;border-radius:8px;background:#ddf4ff;color:#0969da}
.good{background:#dafbe1;color:#1a7f37} pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:360px;
 font-size:12px;margin:0;white-space:pre-wrap;word-break:break-all} .muted{color:#57606a} .err{color:#cf222e}
#logbox{display:flex;flex-direction:column-reverse;overflow:auto;max-height:360px;background:#f6f8fa}
#logbox pre{max-height:none;overflow:visible} #log .newest{background:#fff8c5}
#fallback{background:#fff8c5;border-left:4px solid #d4a72c;padding:4px 8px;margin:8px 16px 0}
#failed-next{background:#ffebe9;border-left:4px solid #82071e;padding:4px 8px;margin:8px 16px 0}
#states{display:flex;flex-wrap:wrap;gap:4px} .st{color:#fff;padding:1px 8px;border-radius:8px;font-size:12px;
 white-space:nowrap}
#incidents td{overflow-wrap:anywhere;white-space:normal} .links a{white-space:nowrap;margin-right:6px}
#actions{margin-left:auto} #actions button{font:inherit;font-size:12px}
"""


@dataclass(frozen=True)
class PageData:
    snapshot: StatusSnapshot
    bundles: Sequence[tuple[str, dict[str, Any] | None]]  # (id, summary), newest first
    log_lines: Sequence[str]
    timeline: Sequence[TimelinePoint]
    # The journal's last state changes, oldest first: a state that lasted a millisecond (hung, before
    # the capture starts) is still seen here on the next refresh.
    transitions: Sequence[dict[str, Any]] = ()
    csrf: str = ""  # the page's forms carry it (api/session.py); empty: no action buttons
    session: bool = False  # viewed through a login session: offer "log out"
    all_logs: bool = False  # the log panel shows the daemon's own polls of the server too
    now: float | None = None  # epoch seconds when rendered: "2 min ago" beside each time (None: none)


def e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def t(value: object, now: float | None) -> str:
    """A time in the host's local zone with its offset, and how long ago beside it (escaped)."""
    rel = ago(value, now) if now is not None else ""
    return f"<time>{e(when(value))}</time>" + (f" <span class='muted rel'>({e(rel)})</span>" if rel else "")


def on_fallback(s: StatusSnapshot) -> bool:
    """Serving, but on a rung below the preferred one: its own condition, amber (issue 38)."""
    return s.state in ("ready", "degraded") and (s.rung_index or 0) > 0


def render(d: PageData) -> str:
    s = d.snapshot
    fallback = on_fallback(s)
    colour = FALLBACK_COLOUR if fallback else STATE_COLOURS.get(s.state, "#6e7781")
    badge = f"{e(s.state)} (fallback)" if fallback else e(s.state)
    actions = action_bar(d.csrf, d.session) if d.csrf else ""
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<meta http-equiv='refresh' content='{REFRESH_S}'>",
        f"<title>{e(s.state)} - sglang-supervisor</title><style>{CSS}</style></head><body>",
        f"<header><div id='state' data-state='{e(s.state)}' data-fallback='{str(fallback).lower()}' "
        f"style='background:{colour}'>{badge}</div>",
        f"<div><div><b>{e(s.reason)}</b></div><div class='muted'>{_headline(s, d.now)}</div></div>{actions}</header>",
        _fallback(s, d.csrf, d.now) if fallback else "",
        _failed(s, d.csrf) if s.state == "failed" else "",
        "<main>",
        _section("Ladder", _ladder(s)),
        _section("Server", _server(s, d.now)),
        _section("Recent states", _states(d.transitions), wide=True),
        _section("Start-up timeline", _timeline(d.timeline), wide=True),
        _section("Launch and outage", launch_section(s), wide=True),
        _section("Incidents and evidence", _incidents(s, d.bundles, d.now), wide=True),
        _section("Server log (newest last)", _log_note(d.all_logs) + _log(d.log_lines), wide=True),
        f"</main><footer class='muted' style='padding:8px 16px'>sglang-supervisor {e(s.version)}; refreshes every "
        f"{REFRESH_S} s; times in this host's zone; JSON: /status, /events, /diagnostics</footer></body></html>",
    ]
    return "".join(parts)


def _states(transitions: Sequence[dict[str, Any]]) -> str:
    """Each state entered, coloured, with when and for how long (to the next change), newest last."""
    if not transitions:
        return "<p class='muted'>no state change journalled yet</p>"
    stamps = [_ts(r.get("ts")) for r in transitions]
    cells = []
    for i, r in enumerate(transitions):
        state = str(r.get("new") or "")
        held = ""
        if i + 1 < len(transitions) and stamps[i] is not None and stamps[i + 1] is not None:
            held = duration(max(0.0, stamps[i + 1] - stamps[i]))  # type: ignore[operator]
        cells.append(
            f"<span class='st' data-state='{e(state)}' title='{e(r.get('reason'))}' "
            f"style='background:{STATE_COLOURS.get(state, '#6e7781')}'>{e(state)}"
            f"<small> {e(when(r.get('ts')))}{' &middot; ' + e(held) if held else ''}</small></span>"
        )
    return f"<div id='states'>{''.join(cells)}</div>"


def _ts(value: object) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _log(lines: Sequence[str]) -> str:
    """The log tail in a box that a browser opens scrolled to its end (column-reverse), whatever the
    refresh does to the scroll position; the newest line is highlighted."""
    if not lines:
        return "<div id='logbox'><pre id='log'>no output yet</pre></div>"
    body = "\n".join(e(ln) for ln in lines[:-1])
    newest = f"<span class='newest' id='log-newest'>{e(lines[-1])}</span>"
    return f"<div id='logbox'><pre id='log'>{body}{chr(10) if body else ''}{newest}</pre></div>"


def _log_note(all_logs: bool) -> str:
    if all_logs:
        return (
            "<p class='muted' id='log-note'>with the daemon's own health and metrics polls "
            "(<a href='/ui'>hide them</a>)</p>"
        )
    return (
        "<p class='muted' id='log-note'>the daemon's own health and metrics polls are hidden "
        "(<a href='/ui?logs=all'>show them</a>; CLI: logs --all); a line "
        "<code>=== sglang-supervisor: launch of rung ...</code> marks where each launch began</p>"
    )


def _fallback(s: StatusSnapshot, csrf: str, now: float | None = None) -> str:
    preferred = s.ladder[0] if s.ladder else "the preferred rung"
    why = ""
    if s.last_incident is not None:
        i = s.last_incident
        cls = f" ({e(i.hang_class)})" if i.hang_class else ""
        why = f"; the last failure: {e(i.cause)}{cls} at {t(i.at, now)}"
    since = f" since {t(s.started_at, now)}" if s.started_at else ""
    control = (
        f"<div>{action_form('promote', csrf, f'promote to {preferred}', 'banner')}"
        f"<span class='muted' id='promote-if-fails'>{e(promote.if_it_fails(s))}</span></div>"
        if csrf
        else f"<div class='muted' id='promote-if-fails'>{e(promote.if_it_fails(s))}</div>"
    )
    return (
        f"<div id='fallback'><b>serving on fallback rung {e(s.rung)}</b>{since}, not on the preferred "
        f"{e(preferred)}{why}. <span class='muted'>promote: try the preferred rung again "
        f"(sglang-supervisor promote)</span>{control}</div>"
    )


def _failed(s: StatusSnapshot, csrf: str) -> str:
    """FAILED: not serving, and the next step in words, with the button that takes it."""
    preferred = s.ladder[0] if s.ladder else "the preferred rung"
    retry = (
        f" The daemon tries again by itself from {e(preferred)} in {e(duration(s.next_attempt_in_s))} "
        "(failed_cooldown_s)."
        if s.next_attempt_in_s is not None
        else " The daemon does not try again by itself (failed_cooldown_s is 0): it waits for you."
    )
    control = action_form("start", csrf, f"start on {preferred}", "banner") if csrf else ""
    return (
        f"<div id='failed-next'><b>Not serving: every rung failed.</b> Next: open the newest incident's "
        f"summary.txt below (what failed, the stacks), fix the cause (a driver, a flag, the model path), then "
        f"start the server: it begins again at the preferred rung {e(preferred)} "
        f"(sglang-supervisor start).{retry} {control}</div>"
    )


def _section(title: str, body: str, *, wide: bool = False) -> str:
    cls = " class='wide'" if wide else ""
    return f"<section{cls}><h2>{e(title)}</h2>{body}</section>"


def _headline(s: StatusSnapshot, now: float | None = None) -> str:
    bits = [f"since {t(s.since, now)}" if s.since else "", f"rung {e(s.rung)}" if s.rung else ""]
    if s.pid is not None:
        bits.append(f"pid {s.pid}")
    if s.phase and s.state == "starting":
        bits.append(f"phase {e(s.phase)}")
    if s.progress is not None and s.state == "starting":
        bits.append(f"{e(s.progress.label)} {s.progress.done}/{s.progress.total}")
    if s.next_attempt_in_s is not None:
        bits.append(f"next attempt in {e(duration(s.next_attempt_in_s))}")
    return " &middot; ".join(b for b in bits if b)


def _ladder(s: StatusSnapshot) -> str:
    rows = []
    for i, name in enumerate(s.ladder):
        tags = []
        if name == s.rung:
            tags.append("<span class='tag'>current</span>")
        if name == s.last_good_rung:
            tags.append("<span class='tag good'>last good</span>")
        cls = " class='cur'" if name == s.rung else ""
        engine = s.ladder_engines[i] if i < len(s.ladder_engines) else ""
        rows.append(f"<tr{cls}><td>{i}</td><td>{e(name)}</td><td>{e(engine)}</td><td>{' '.join(tags)}</td></tr>")
    head = "<tr><th>#</th><th>rung</th><th>engine</th><th></th></tr>"
    return f"<table id='ladder'>{head}{''.join(rows)}</table>"


def _server(s: StatusSnapshot, now: float | None = None) -> str:
    sv = s.serving
    rows: list[tuple[str, str]] = [
        ("restarts", e(restarts_text(s.restarts, s.restarts_last_hour))),
        ("incidents", f"{s.incidents} since the daemon started (the table below: the bundles kept)"),
    ]
    if s.time_to_ready_s is not None:
        rows.append(("time to ready", e(duration(s.time_to_ready_s))))
    if s.last_progress_s is not None and s.state == "starting":
        rows.append(("since progress", e(duration(s.last_progress_s))))
    if s.state in ("ready", "degraded"):
        if sv.health_ok is not None:
            rows.append(("health", "ok" if sv.health_ok else f"failing ({e(sv.health_error)})"))
        if sv.running_reqs is not None:
            rows.append(("running / queued", f"{sv.running_reqs:g} / {sv.queue_reqs or 0:g}"))
        if sv.token_rate is not None:
            rows.append(("tokens/s", f"{sv.token_rate:.0f}"))
        if sv.spec_accept_length is not None:
            rows.append(("spec accept length", f"{sv.spec_accept_length:.2f}"))
    if s.gpu.status == "ok":
        used = sum(d.mem_used_bytes for d in s.gpu.devices) / 2**30
        rows.append(("GPUs", f"{len(s.gpu.devices)}, {used:.1f} GiB used, {s.gpu.tree_mem_bytes / 2**30:.1f} GiB ours"))
    else:
        rows.append(("GPUs", f"unavailable: {e(s.gpu.reason)}"))
    bad = [c for c in s.selfcheck if not c.ok and c.name != "cuda-gdb" and c.kind != "capability"]
    for c in bad:
        rows.append((f"{e(c.name)}", f"<span class='err'>missing: {e(c.detail)}</span>"))
    for c in s.selfcheck:
        if not c.ok and c.kind == "capability":  # what this GPU cannot do: said, not red
            instead = f"; uses {e(c.instead)} instead" if c.instead else ""
            rows.append((f"{e(c.name)}", f"<span class='muted'>not available here: {e(c.detail)}{instead}</span>"))
    for n in s.notifications:
        if n.failed or n.dropped:
            rows.append(
                (
                    f"notify {e(n.target)}",
                    f"<span class='err'>{n.failed} failed, {n.dropped} dropped ({n.ok} ok); last: "
                    f"{e(n.last_error)} at {t(n.last_failed_at, now)}</span>",
                )
            )
        elif n.ok:
            rows.append((f"notify {e(n.target)}", f"{n.ok} delivered, last at {t(n.last_ok_at, now)}"))
    w = s.write_errors
    if s.loop_errors or w.journal or w.server_log or w.state or w.bundle:
        rows.append(
            (
                "daemon errors",
                f"<span class='err'>loop {s.loop_errors}, writes journal {w.journal} log "
                f"{w.server_log} state {w.state} bundle {w.bundle}</span>",
            )
        )
    return "<table id='server'>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _incidents(
    s: StatusSnapshot, bundles: Sequence[tuple[str, dict[str, Any] | None]], now: float | None = None
) -> str:
    rows = []
    if s.last_incident is not None and s.last_incident.bundle is None:
        i = s.last_incident
        rows.append(
            f"<tr><td>{e(i.id)}</td><td>{e(i.cause)}</td><td>{e(i.hang_class or '')}</td><td>{t(i.at, now)}</td>"
            f"<td>{e(i.detail)}</td><td class='muted'>no bundle</td></tr>"
        )
    for bid, summary in bundles:
        sm = summary or {}
        reasons = sm.get("reasons") if isinstance(sm.get("reasons"), list) else []
        frames = sm.get("frames") if isinstance(sm.get("frames"), list) else []
        # Whole, wrapped by the browser: a cut reason ("holding the GIL, no") misleads at 3 am.
        why = e("; ".join(str(r) for r in (reasons or [])))
        if frames:
            why += f" <span class='muted'>at {e(str(frames[0]))}</span>"
        culprit = sm.get("culprit")
        if isinstance(culprit, dict) and culprit.get("text"):  # the thread that stopped progress, first
            why = f"<div class='culprit'><b>{e(str(culprit['text']))}</b></div>" + why
        where = " / ".join(str(x) for x in (sm.get("rung"), sm.get("phase")) if x)
        created = sm.get("created_at")
        rows.append(
            f"<tr><td>{e(bid)}</td><td>{e(sm.get('cause') or sm.get('trigger') or '')}</td>"
            f"<td>{e(sm.get('hang_class') or '')}</td><td>{t(sm.get('created_at'), now) if created else ''}</td>"
            f"<td>{why}"
            f"<div class='muted'>{e(where)}</div></td><td class='links'>"
            f"<a href='/diagnostics/{e(bid)}/summary.txt' class='summary-txt'>summary.txt</a>"
            f"<a href='/diagnostics/{e(bid)}/summary.json' class='summary-json'>JSON</a></td></tr>"
        )
    if not rows:
        return "<p class='muted'>none</p>"
    head = "<tr><th>id</th><th>cause</th><th>hang class</th><th>at</th><th>why</th><th></th></tr>"
    return f"<table id='incidents'>{head}{''.join(rows)}</table>"


def _timeline(points: Sequence[TimelinePoint]) -> str:
    if len(points) < 2:
        return "<p class='muted'>no start-up recorded since the daemon started</p>"
    w, h, left, top = 900, 60 + 14 * len(CHANNELS), 70, 8
    plot_w, plot_h = w - left - 10, 50
    span = max(points[-1].t_s, 1e-6)
    peak = max(p.gpu_mem_bytes for p in points) or 1

    def x(t: float) -> float:
        return round(left + plot_w * t / span, 1)

    def y(frac: float) -> float:
        return round(top + plot_h * (1 - frac), 1)

    load = " ".join(f"{x(p.t_s)},{y(p.fraction)}" for p in points if p.fraction is not None)
    mem = " ".join(f"{x(p.t_s)},{y(p.gpu_mem_bytes / peak)}" for p in points)
    out = [
        f"<svg id='timeline' xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' viewBox='0 0 {w} {h}'>",
        f"<rect x='{left}' y='{top}' width='{plot_w}' height='{plot_h}' fill='#f6f8fa'/>",
        f"<text x='0' y='{top + 10}' font-size='11' fill='#0969da'>load %</text>",
        f"<text x='0' y='{top + 24}' font-size='11' fill='#8250df'>GPU mem</text>",
        f"<text x='0' y='{top + 38}' font-size='10' fill='#57606a'>peak {peak / 2**30:.1f} GiB</text>",
    ]
    if load:
        out.append(f"<polyline fill='none' stroke='#0969da' stroke-width='2' points='{load}'/>")
    out.append(f"<polyline fill='none' stroke='#8250df' stroke-width='2' points='{mem}'/>")
    for row, channel in enumerate(CHANNELS):
        cy = top + plot_h + 12 + 14 * row
        out.append(f"<text x='0' y='{cy + 4}' font-size='10' fill='#57606a'>{channel}</text>")
        for p in points:
            if channel in p.channels:
                out.append(f"<rect x='{x(p.t_s) - 1}' y='{cy - 4}' width='3' height='8' fill='#1a7f37'/>")
    out.append(
        f"<text x='{w - 10}' y='{h - 2}' font-size='10' text-anchor='end' fill='#57606a'>{span:.0f} s</text></svg>"
    )
    return "".join(out)
