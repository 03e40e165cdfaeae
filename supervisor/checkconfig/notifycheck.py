"""`check-config` lists the `[[notify]]` targets (issue 38: it did not): where each event goes,
which events, its retries and timeout. A URL is shown as scheme://host only, and files by path:
this output ends up in CI logs and tickets."""

from __future__ import annotations

from urllib.parse import urlsplit

from supervisor.config.alerting import NotifyTarget
from supervisor.config.settings import Settings


def _where(t: NotifyTarget) -> str:
    if t.kind == "exec":
        return f"exec {t.argv[0] if t.argv else '?'} ({len(t.argv) - 1} arguments)"
    if t.url:
        parts = urlsplit(t.url)
        dest = f"{parts.scheme}://{parts.hostname or '?'}{':' + str(parts.port) if parts.port else ''}/..."
    else:
        dest = f"the URL in {t.url_file}"
    key = f", routing key in {t.routing_key_file}" if t.routing_key_file else ""
    return f"webhook {t.format} to {dest}{key}"


def notify_doc(t: NotifyTarget) -> dict[str, object]:
    return {
        "name": t.name,
        "where": _where(t),
        "events": list(t.wanted),
        "retries": t.retries,
        "timeout_s": t.timeout_s,
    }


def notify_lines(settings: Settings) -> list[str]:
    if not settings.notify:
        return ["notify: no [[notify]] target: incidents reach only the journal, /metrics and the page"]
    return [
        f"notify {t.name}: {_where(t)}; events {', '.join(t.wanted)}; retries {t.retries}, timeout {t.timeout_s:g} s"
        for t in settings.notify
    ]
