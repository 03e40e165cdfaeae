"""`launch_blocked`: a launch refused until the refused-launch backoff reached its cap is told once,
naming the holder; the `ready` that ends the wait is a recovery (PagerDuty: resolve)."""

from __future__ import annotations

from supervisor.alerting import shapes
from supervisor.alerting.events import Tracker
from supervisor.config.alerting import NotifyTarget

BLOCKED = {
    "event": "launch_blocked",
    "ts": "2026-12-01T10:00:00.000Z",
    "rung": "base",
    "reason": "the launch does not fit: GPU 0: 3.0 GiB free of 141 GiB, ...; held by pid 123 (python nb.py) 138.0 GiB",
    "refusals": 7,
}


def test_a_blocked_launch_is_told_with_its_holder_then_its_end_is_a_recovery() -> None:
    t = Tracker("gpu7:30000")
    ev = t.feed(BLOCKED)
    assert ev is not None and ev.kind == "launch_blocked" and ev.rung == "base"
    assert "pid 123 (python nb.py)" in ev.summary and "not launching rung base" in ev.summary
    assert ev.incident_id is None
    rec = t.feed({"event": "server_ready", "ts": "t", "rung": "base"})
    assert rec is not None and rec.kind == "recovered" and rec.incident_id is None
    assert t.feed({"event": "server_ready", "ts": "t", "rung": "base"}) is None


def test_every_target_hears_it_by_default_and_pagerduty_pages_then_resolves() -> None:
    hook = NotifyTarget(name="h", kind="exec", argv=("/bin/true",))
    pd = NotifyTarget(name="pd", format="pagerduty", routing_key_file="/k")
    assert "launch_blocked" in hook.wanted and "launch_blocked" in pd.wanted
    t = Tracker("h:30000")
    ev = t.feed(BLOCKED)
    assert ev is not None
    body = shapes.pagerduty(ev, "key")
    assert body["event_action"] == "trigger" and "pid 123" in body["payload"]["summary"]
    rec = t.feed({"event": "server_ready", "ts": "t", "rung": "base"})
    assert rec is not None and shapes.pagerduty(rec, "key")["event_action"] == "resolve"
    assert shapes.hook_env(ev)["SGLANG_SUPERVISOR_EVENT"] == "launch_blocked"
