"""The page's "Launch and outage" section (issue 36): the current or last launch's milestones with
each phase's time beside the last good launch of the same rung, the kernel cache, the start-up stall
window in force, and the last outage in its parts."""

from __future__ import annotations

import html

from supervisor.status.snapshot import StatusSnapshot


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s"


def launch_section(s: StatusSnapshot) -> str:
    tl = s.launch_timeline
    parts: list[str] = []
    if s.stall_window is not None:
        w = s.stall_window
        parts.append(
            f"<p id='stall-window'>stall window {w.window_s:g} s in {_e(w.phase)} ({_e(w.source)}: {_e(w.why)})</p>"
        )
    if tl is None:
        parts.append("<p class='muted'>no launch yet</p>")
    else:
        before = {m.name: m.phase_s for m in tl.last_good}
        rows = "".join(
            f"<tr><td>{_e(m.name)}</td><td>{m.at_s:.1f}</td><td>{_s(m.phase_s)}</td><td>{_s(before.get(m.name))}</td></tr>"
            for m in tl.milestones
        )
        parts.append(
            f"<table id='launch'><tr><th>milestone</th><th>at s</th><th>phase</th><th>last good</th></tr>{rows}</table>"
        )
        for line in tl.compared:
            parts.append(f"<p class='bad'>{_e(line)}</p>")
        if tl.cache is not None:
            c = tl.cache
            aside = f", set aside: {_e(c.set_aside)}" if c.set_aside else ""
            parts.append(f"<p>kernel cache {_e(c.state)}, {c.bytes_before} bytes before{aside}</p>")
        if tl.residency is not None:
            parts.append(f"<p>weights in the page cache before the launch: {tl.residency.fraction:.0%}</p>")
    o = s.outage or s.last_outage
    if o is not None:
        label = "outage under way" if s.outage is not None else "last outage"
        pieces = ", ".join(f"{_e(k)} {v:.1f} s" for k, v in o.parts.items())
        total = "" if o.total_s is None else f" {o.total_s:.1f} s"
        parts.append(
            f"<p id='outage'>{label} ({_e(o.cause)}){total}: {pieces}; the daemon's share {_s(o.daemon_s)}</p>"
        )
    return "".join(parts)
