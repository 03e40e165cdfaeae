"""[[notify]]: what is worth telling (pure), each receiver's body (pure), the settings' rules, and the
dispatcher's bounded queue against a real hanging receiver."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from receivers import receiver

from supervisor.alerting import shapes
from supervisor.alerting.deliver import load_secrets
from supervisor.alerting.dispatch import Alerter, NotifyMetrics
from supervisor.alerting.events import Tracker
from supervisor.common.configerror import ConfigError
from supervisor.config.alerting import NotifyTarget
from supervisor.config.settings import settings_from_mapping
from supervisor.status.journal import Journal

INC = {
    "event": "incident",
    "ts": "2026-12-01T10:00:00.000Z",
    "id": "I1",
    "cause": "startup_stall",
    "hang_class": "idle_deadlock",
    "rung": "base",
    "detail": "no progress for 180 s",
    "bundle": "I1",
}


def kinds(records: list[dict[str, Any]]) -> list[str | None]:
    t = Tracker("gpu7:30000")
    return [(ev.kind if (ev := t.feed(r)) is not None else None) for r in records]


def test_incident_then_ready_is_a_recovery_naming_the_incident() -> None:
    t = Tracker("gpu7:30000")
    inc = t.feed(INC)
    assert inc is not None and inc.kind == "incident" and inc.bundle == "I1" and inc.hang_class == "idle_deadlock"
    assert "idle_deadlock" in inc.summary and "gpu7:30000" in inc.summary and "I1" in inc.summary
    rec = t.feed({"event": "server_ready", "ts": "t", "rung": "no-graph"})
    assert rec is not None and rec.kind == "recovered" and rec.incident_id == "I1" and rec.rung == "no-graph"
    # the recovery names what it recovered from (issue 38: "cause": null)
    assert (rec.cause, rec.hang_class) == (INC["cause"], "idle_deadlock") and str(INC["cause"]) in rec.summary
    assert t.feed({"event": "server_ready", "ts": "t", "rung": "no-graph"}) is None, "one recovery per incident"


def test_a_recovery_names_one_incident_whole_and_says_whether_the_rung_is_the_preferred_one() -> None:
    # issue 53: "recovered after <the last id> (<the first incident's cause>)" paired two incidents
    t = Tracker("h:1", lambda: "base")
    t.feed(INC)
    t.feed({**INC, "id": "I2", "cause": "exited", "hang_class": None, "bundle": None, "rung": "base"})
    t.feed({**INC, "id": "I3", "cause": "serving_stall", "hang_class": "busy_loop", "bundle": "I3", "rung": "mid"})
    rec = t.feed({"event": "server_ready", "ts": "t", "rung": "no-graph"})
    assert rec is not None
    assert (rec.incident_id, rec.cause, rec.hang_class, rec.bundle) == ("I1", "startup_stall", "idle_deadlock", "I1")
    assert rec.later_incidents == 2 and rec.last_incident is not None and rec.last_incident.id == "I3"
    assert rec.summary == (
        "SGLang h:1: recovered after I1 (startup_stall, idle_deadlock) and 2 more incidents, the last I3 "
        "(serving_stall, busy_loop), serving on rung no-graph (a fallback, not the preferred rung base: "
        "`promote` tries it again)"
    )
    body = shapes.generic(rec)
    assert body["incident"]["id"] == "I1" and body["incident"]["cause"] == "startup_stall"
    assert body["last_incident"] == {"id": "I3", "cause": "serving_stall", "hang_class": "busy_loop", "bundle": "I3"}
    assert (body["preferred_rung"], body["on_preferred_rung"]) == ("base", False)
    # the next episode starts afresh, and a recovery onto rung 0 says so
    t.feed({**INC, "id": "I9", "cause": "exited", "hang_class": None})
    rec = t.feed({"event": "server_ready", "ts": "t", "rung": "base"})
    assert rec is not None
    assert rec.summary == "SGLang h:1: recovered after I9 (exited), serving on rung base (the preferred rung)"
    assert shapes.hook_env(rec)["SGLANG_SUPERVISOR_ON_PREFERRED_RUNG"] == "true"


def test_ready_without_an_incident_and_manual_restarts_are_not_told() -> None:
    assert kinds(
        [
            {"event": "server_ready", "rung": "base"},
            {**INC, "cause": "manual"},
            {"event": "server_ready", "rung": "base"},
            {"event": "state_changed", "old": "ready", "new": "degraded"},
            {"event": "notification", "outcome": "ok"},
        ]
    ) == [None, None, None, None, None]


def test_failed_once_then_recovered_and_stayed_stopped() -> None:
    assert kinds(
        [
            {"event": "state_changed", "old": "restarting", "new": "failed", "reason": "ladder exhausted"},
            {"event": "state_changed", "old": "failed", "new": "failed"},
            {"event": "server_ready", "rung": "base"},
            {"event": "stayed_stopped", "reason": "stopped by request"},
        ]
    ) == ["failed", None, "recovered", "stayed_stopped"]
    t = Tracker("h:1")
    t.feed({"event": "state_changed", "old": "restarting", "new": "failed", "reason": "ladder exhausted"})
    rec = t.feed({"event": "server_ready", "rung": "base"})
    assert rec is not None and rec.cause == "failed"  # a recovery out of failed says so, not null


def test_pagerduty_triggers_and_resolves_one_alert_per_server() -> None:
    t = Tracker("h:30000")
    inc, fail, rec = (
        t.feed(INC),
        t.feed({"event": "state_changed", "old": "restarting", "new": "failed"}),
        t.feed({"event": "server_ready", "rung": "base"}),
    )
    assert inc is not None and fail is not None and rec is not None
    bodies = [shapes.pagerduty(e, "KEY") for e in (inc, fail, rec)]
    assert [b["event_action"] for b in bodies] == ["trigger", "trigger", "resolve"]
    assert len({b["dedup_key"] for b in bodies}) == 1
    assert bodies[0]["payload"]["severity"] == "error" and bodies[1]["payload"]["severity"] == "critical"
    assert "payload" not in bodies[2]
    assert json.dumps(shapes.slack(inc))  # serialisable
    env = shapes.hook_env(inc)
    assert env["SGLANG_SUPERVISOR_EVENT"] == "incident" and env["SGLANG_SUPERVISOR_HANG_CLASS"] == "idle_deadlock"


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"name": "a"}, "needs url or url_file"),
        ({"name": "a", "url": "ftp://x"}, "http://"),
        ({"name": "a", "url": "http://x", "url_file": "/f"}, "not both"),
        ({"name": "a", "format": "pagerduty"}, "routing_key_file"),
        ({"name": "a", "kind": "exec"}, "needs argv"),
        ({"name": "a", "kind": "exec", "argv": ["x"], "url": "http://x"}, "takes argv"),
        ({"name": "a", "url": "http://x", "events": ["incidents"]}, "notify.0.events.0"),
        ({"name": "a", "format": "pagerduty", "routing_key_file": "/k", "events": ["stayed_stopped"]}, "pagerduty"),
        ({"name": "a", "url": "http://x", "retries": -1}, "retries"),
        ({"name": "a", "url": "http://x", "colour": "red"}, "unknown key"),
    ],
)
def test_bad_notify_tables_are_refused_with_the_key(table: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        settings_from_mapping({"notify": [table]})


def test_two_targets_with_one_name_are_refused() -> None:
    with pytest.raises(ConfigError, match="two \\[\\[notify\\]\\] targets"):
        settings_from_mapping({"notify": [{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}]})


def test_secret_files_must_be_private_and_readable(tmp_path: Path) -> None:
    f = tmp_path / "url"
    f.write_text("https://hooks.example/T0KEN\n")
    f.chmod(0o644)
    target = NotifyTarget(name="a", url_file=str(f))
    with pytest.raises(ConfigError, match="chmod 600"):
        load_secrets(target)
    f.chmod(0o600)
    assert load_secrets(target).url == "https://hooks.example/T0KEN"
    with pytest.raises(ConfigError, match="cannot read"):
        load_secrets(NotifyTarget(name="b", url_file=str(tmp_path / "missing")))
    key = tmp_path / "k"
    key.write_text("R0UTING\n")
    key.chmod(0o600)
    pd = load_secrets(NotifyTarget(name="p", format="pagerduty", routing_key_file=str(key)))
    assert pd.routing_key == "R0UTING" and pd.url == "https://events.pagerduty.com/v2/enqueue"
    assert pd.redact("key R0UTING at x") == "key <redacted> at x"


@pytest.mark.integration  # waits out two 2 s delivery timeouts
async def test_a_full_queue_drops_the_oldest_and_counts_it(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "events.jsonl")
    registry = CollectorRegistry()
    with receiver("hang") as (url, got):
        target = NotifyTarget(name="slow", url=f"{url}/x", timeout_s=2.0, retries=0, queue_size=1)
        alerter = Alerter((target,), journal=journal, metrics=NotifyMetrics(registry), instance="h:1", hook_env={})
        alerter.start()
        journal.listeners.append(alerter.offer)
        journal.append("incident", id="A", cause="exited", rung="base")  # taken by the worker, hangs
        await asyncio.sleep(0.3)
        journal.append("server_ready", rung="base")  # queued
        journal.append("incident", id="B", cause="exited", rung="base")  # pushes `recovered` out
        records = journal.read(100)
        dropped = [r for r in records if r["event"] == "notification" and r["outcome"] == "dropped"]
        assert [(d["notified"], d["incident_id"]) for d in dropped] == [("recovered", "A")]
        value = registry.get_sample_value(
            "sglang_supervisor_notifications_total", {"target": "slow", "event": "recovered", "outcome": "dropped"}
        )
        assert value == 1.0
        await alerter.close(grace_s=5.0)
        outcomes = [(r["notified"], r["outcome"]) for r in journal.read(100) if r["event"] == "notification"]
        assert outcomes == [("recovered", "dropped"), ("incident", "failed"), ("incident", "failed")]
        assert len(got.bodies("/x")) == 2


def test_check_config_names_unreadable_secrets_and_missing_hooks(tmp_path: Path) -> None:
    from supervisor.checkconfig.check import check_settings

    loose = tmp_path / "url"
    loose.write_text("https://hooks.example/T0KEN\n")
    loose.chmod(0o644)
    settings = settings_from_mapping(
        {
            "server": {"command": ["/bin/true"]},
            "notify": [
                {"name": "slack", "format": "slack", "url_file": str(loose)},
                {"name": "hook", "kind": "exec", "argv": [str(tmp_path / "no-such-hook")]},
                {"name": "ok", "kind": "exec", "argv": ["/bin/true"]},
            ],
        }
    )
    lines = [f.line() for f in check_settings(settings, {"PATH": "/usr/bin:/bin"})]
    assert any(line.startswith("error: notify[0] (slack)") and "chmod 600" in line for line in lines), lines
    assert any(line.startswith("error: notify[1] (hook).argv") for line in lines), lines
    assert not any("notify[2]" in line for line in lines)
    assert "T0KEN" not in "\n".join(lines)


async def test_a_4xx_is_not_retried_and_a_5xx_is_until_the_retries_run_out(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "events.jsonl")
    with receiver("reject") as (bad, rejected), receiver("fail") as (down, failing):
        targets = (
            NotifyTarget(name="wrong-url", url=f"{bad}/x", retries=3, backoff_initial_s=0.05),
            NotifyTarget(name="down", url=f"{down}/x", retries=2, backoff_initial_s=0.05, backoff_max_s=0.1),
        )
        alerter = Alerter(
            targets, journal=journal, metrics=NotifyMetrics(CollectorRegistry()), instance="h:1", hook_env={}
        )
        alerter.start()
        journal.listeners.append(alerter.offer)
        journal.append("incident", id="A", cause="exited", rung="base")
        assert await alerter.drain(10.0)
        await alerter.close()
    ledger = {r["target"]: r for r in journal.read(100) if r["event"] == "notification"}
    assert ledger["wrong-url"]["attempts"] == 1 and ledger["wrong-url"]["status"] == 404
    assert ledger["down"]["attempts"] == 3 and ledger["down"]["error"] == "HTTP 500"
    assert len(rejected.bodies("/x")) == 1 and len(failing.bodies("/x")) == 3


def test_the_documented_notify_examples_are_valid() -> None:
    import re

    import tomllib

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "CONFIGURATION.md").read_text()
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", doc, re.S) if "[[notify]]" in b]
    example = (root / "systemd" / "config.example.toml").read_text()
    uncommented = "\n".join(
        line[1:] for line in example.splitlines() if line.startswith("#") and not line.startswith("# ")
    )
    assert blocks and "[[notify]]" in uncommented
    for text in (*blocks, uncommented):
        settings = settings_from_mapping(tomllib.loads(text))
        assert {t.name for t in settings.notify} == {"oncall-slack", "pagerduty", "ticket"}


def test_slack_text_is_escaped_and_pagerduty_text_is_bounded_plain_text() -> None:
    from supervisor.alerting.events import NotifyEvent

    forged = "rank died <!channel> see <https://evil.example|the runbook> & `code` \x1b[31m"
    ev = NotifyEvent(kind="failed", at="2026-12-02T00:00:00Z", instance="h:1", reason=forged, cause="x`y<!here>")
    body = shapes.slack(ev)
    text = json.dumps(body)
    assert "<!channel>" not in text and "<https://" not in text and "<!here>" not in text
    assert "&lt;!channel&gt;" in body["text"] and "&amp;" in body["text"] and "\x1b" not in body["text"]
    context = body["blocks"][1]["elements"][0]["text"]
    assert context.count("`") == 2, "a value cannot leave its code span"
    pd = shapes.pagerduty(NotifyEvent(kind="failed", at="t", instance="h:1", reason="r\n" * 5000), "rk")
    summary = pd["payload"]["summary"]
    assert len(summary) <= shapes.PD_SUMMARY_MAX and "\n" not in summary
    assert len(pd["payload"]["custom_details"]["reason"]) <= shapes.PD_FIELD_MAX
