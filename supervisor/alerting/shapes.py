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
    }


_SLACK_ICON = {"incident": ":warning:", "failed": ":red_circle:", "recovered": ":white_check_mark:"}


def slack(ev: NotifyEvent) -> dict[str, Any]:
    text = f"{_SLACK_ICON.get(ev.kind, ':information_source:')} {ev.summary}"
    fields = [
        f"*{k}*: `{v}`"
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
            "summary": ev.summary[:1024],
            "source": ev.instance,
            "severity": "critical" if ev.kind == "failed" else "error",
            "component": "sglang",
            "group": ev.rung or "sglang",
            "class": ev.cause or ev.kind,
            "custom_details": generic(ev),
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
    }
