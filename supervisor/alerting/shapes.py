"""The body each kind of receiver expects (pure). `json` is this project's own shape (also what an
exec hook reads on stdin); `slack` is an incoming-webhook message; `pagerduty` is an Events API v2
event: trigger on incident and failed, resolve on recovered, one alert per server (the dedup key)."""

from __future__ import annotations

from typing import Any

from supervisor.alerting.events import NotifyEvent

SCHEMA_VERSION = 1


def generic(ev: NotifyEvent) -> dict[str, Any]:
    return {
        "version": SCHEMA_VERSION,
        "event": ev.kind,
        "at": ev.at,
        "instance": ev.instance,
        "rung": ev.rung or None,
        "reason": ev.reason or None,
        "summary": ev.summary,
        "incident": (
            {
                "id": ev.incident_id,
                "cause": ev.cause,
                "hang_class": ev.hang_class,
                "bundle": ev.bundle,
                "culprit": ev.culprit,
            }
            if ev.incident_id is not None or ev.cause is not None
            else None
        ),
        **(_recovered(ev) if ev.kind == "recovered" else {}),
    }


def _recovered(ev: NotifyEvent) -> dict[str, Any]:
    """What a `recovered` adds: where it serves against the preferred rung, and the episode's later
    incidents (each with its own id, cause and class)."""
    last = ev.last_incident
    return {
        "preferred_rung": ev.preferred_rung,
        "on_preferred_rung": ev.on_preferred,
        "later_incidents": ev.later_incidents,
        "last_incident": (
            {"id": last.id, "cause": last.cause, "hang_class": last.hang_class, "bundle": last.bundle}
            if last is not None
            else None
        ),
    }


def slack_escape(text: str) -> str:
    """Text as Slack mrkdwn shows it literally: `&`, `<`, `>` escaped (so `<!channel>`, `<@U1>` and
    `<https://evil|click>` in a reason are shown, not acted on), backticks turned to quotes (a value
    cannot leave its code span), control characters dropped, at most SLACK_MAX characters."""
    text = "".join(c for c in text if c >= " " or c == "\n")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("`", "'")
    return text[:SLACK_MAX]


def plain(text: str, limit: int) -> str:
    """One line of plain text at most `limit` characters (PagerDuty's summary is 1,024)."""
    flat = " ".join("".join(c if c >= " " else " " for c in text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


SLACK_MAX = 3000  # Slack's limit for a section block's text
PD_SUMMARY_MAX = 1024
PD_FIELD_MAX = 2048  # each string in custom_details: a reason can be anything a peer or the server wrote


def _bounded(value: Any) -> Any:
    if isinstance(value, str):
        return plain(value, PD_FIELD_MAX)
    if isinstance(value, dict):
        return {k: _bounded(v) for k, v in value.items()}
    return value


_SLACK_ICON = {"incident": ":warning:", "failed": ":red_circle:", "recovered": ":white_check_mark:"}


def slack(ev: NotifyEvent) -> dict[str, Any]:
    text = f"{_SLACK_ICON.get(ev.kind, ':information_source:')} {slack_escape(ev.summary)}"
    fields = [
        f"*{k}*: `{slack_escape(v)}`"
        for k, v in (
            ("incident", ev.incident_id),
            ("cause", ev.cause),
            ("hang class", ev.hang_class),
            ("bundle", ev.bundle),
        )
        if v
    ]
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
    if fields:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": "  ".join(fields)}]})
    return {"text": text, "blocks": blocks}


def pagerduty_dedup_key(instance: str) -> str:
    return f"sglang-supervisor/{instance}"


def pagerduty(ev: NotifyEvent, routing_key: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "resolve" if ev.kind == "recovered" else "trigger",
        "dedup_key": pagerduty_dedup_key(ev.instance),
    }
    if ev.kind != "recovered":
        body["payload"] = {
            "summary": plain(ev.summary, PD_SUMMARY_MAX),
            "source": plain(ev.instance, 255),
            "severity": "critical" if ev.kind == "failed" else "error",
            "component": "sglang",
            "group": plain(ev.rung or "sglang", 255),
            "class": plain(ev.cause or ev.kind, 255),
            "custom_details": _bounded(generic(ev)),
        }
    return body


def hook_env(ev: NotifyEvent) -> dict[str, str]:
    """The event as environment variables for an exec hook (empty strings for what it lacks)."""
    return {
        "SGLANG_SUPERVISOR_EVENT": ev.kind,
        "SGLANG_SUPERVISOR_AT": ev.at,
        "SGLANG_SUPERVISOR_INSTANCE": ev.instance,
        "SGLANG_SUPERVISOR_RUNG": ev.rung,
        "SGLANG_SUPERVISOR_REASON": ev.reason,
        "SGLANG_SUPERVISOR_SUMMARY": ev.summary,
        "SGLANG_SUPERVISOR_INCIDENT_ID": ev.incident_id or "",
        "SGLANG_SUPERVISOR_CAUSE": ev.cause or "",
        "SGLANG_SUPERVISOR_HANG_CLASS": ev.hang_class or "",
        "SGLANG_SUPERVISOR_BUNDLE": ev.bundle or "",
        "SGLANG_SUPERVISOR_CULPRIT": ev.culprit or "",
        "SGLANG_SUPERVISOR_PREFERRED_RUNG": ev.preferred_rung or "",
        "SGLANG_SUPERVISOR_ON_PREFERRED_RUNG": "" if ev.on_preferred is None else str(ev.on_preferred).lower(),
    }
