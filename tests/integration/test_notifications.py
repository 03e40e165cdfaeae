"""[[notify]] through the running daemon: real HTTP receivers (one answers, one hangs, one fails
with 500) and a real exec hook, told of an incident, its recovery, `failed` and a stop that stayed."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemonproc import cleanup, start, wait_status
from notifyhook import hook, hook_calls, with_notify
from receivers import receiver
from statedir import events
from waiting import until

from supervisor.config.alerting import NotifyTarget
from supervisor.config.render import dump_toml as to_toml
from supervisor.config.settings import Settings

pytestmark = pytest.mark.integration

NO_GRAPH = {"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}
SECRET = "T0KEN-s3cr3t-b7f1"


def notes(state_dir: str | Path) -> list[dict[str, Any]]:
    return [e for e in events(state_dir) if e["event"] == "notification"]


def private(path: Path, text: str) -> str:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


async def test_incident_and_recovery_reach_every_receiver_and_failures_are_journalled(  # type: ignore[no-untyped-def]
    daemon, sim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, argv = hook(tmp_path)
    with receiver("ok") as (ok_url, got), receiver("hang") as (hang_url, hung), receiver("fail") as (fail_url, failing):
        url_file = private(tmp_path / "url", f"{ok_url}/hooks/{SECRET}")
        key_file = private(tmp_path / "pd-key", f"rk-{SECRET}")
        fast = {"backoff_initial_s": 0.1, "backoff_max_s": 0.2}
        s = with_notify(
            sim("deadlock_after_load", env={"SGLANG_SIM_UNLESS": "disable-cuda-graph"}, fallback=[NO_GRAPH]),
            NotifyTarget(name="team-json", url_file=url_file),
            NotifyTarget(name="slack", format="slack", url=f"{ok_url}/slack"),
            NotifyTarget(name="pager", format="pagerduty", url=f"{ok_url}/pd", routing_key_file=key_file),
            NotifyTarget(name="hook", kind="exec", argv=argv),
            NotifyTarget(name="hangs", url=f"{hang_url}/x", timeout_s=0.5, retries=1, **fast),
            NotifyTarget(name="fails", url=f"{fail_url}/x", retries=2, **fast),
        )
        r = await daemon(s)
        try:
            await check_story(r, s, got, hung, failing, out)
        finally:
            await r.stop()  # before the receivers close: the daemon's client holds keep-alive connections
    # No secret in the journal or the daemon's log lines
    journal_text = (Path(s.paths.state_dir) / "events.jsonl").read_text()
    assert SECRET not in journal_text and SECRET not in capsys.readouterr().out


async def check_story(r: Any, s: Settings, got: Any, hung: Any, failing: Any, out: Path) -> None:
    if True:
        snap = await r.wait_for(lambda x: x.state == "ready" and x.rung == "no-cuda-graph", 60, "ready on the fallback")
        inc = snap.last_incident
        assert inc is not None and inc.bundle is not None
        await until(lambda: len(notes(s.paths.state_dir)) >= 12, 30, "12 journalled deliveries")

        # The generic JSON shape, to the URL read from url_file
        bodies = got.bodies(f"/hooks/{SECRET}")
        assert [b["event"] for b in bodies] == ["incident", "recovered"]
        first, second = bodies
        culprit = first["incident"].pop("culprit")  # the bundle's first line (issue 35)
        assert culprit.startswith("Culprit: ") and "thread '" in culprit, culprit
        assert first["incident"] == {
            "id": inc.id,
            "cause": "startup_stall",
            "hang_class": inc.hang_class,
            "bundle": inc.bundle,
        }
        assert first["rung"] == "base" and first["version"] == 1 and inc.id in second["summary"]
        assert second["incident"]["id"] == inc.id and second["rung"] == "no-cuda-graph"
        assert second["incident"]["cause"] == "startup_stall"  # what it recovered from, not null (issue 38)
        # one incident's id, cause and class together; where it serves now against the preferred rung (issue 53)
        assert second["incident"] == {**first["incident"], "culprit": None}
        assert (second["preferred_rung"], second["on_preferred_rung"]) == ("base", False)
        assert second["later_incidents"] == 0 and second["last_incident"] is None
        assert f"recovered after {inc.id} (startup_stall, {inc.hang_class})" in second["summary"], second["summary"]
        assert "serving on rung no-cuda-graph (a fallback, not the preferred rung base" in second["summary"]
        # Slack: a message with text; PagerDuty: trigger then resolve on one dedup key
        slack = got.bodies("/slack")
        assert len(slack) == 2 and "startup_stall" in slack[0]["text"] and inc.bundle in slack[0]["text"]
        pd = got.bodies("/pd")
        assert [b["event_action"] for b in pd] == ["trigger", "resolve"]
        assert pd[0]["routing_key"] == f"rk-{SECRET}" and pd[0]["dedup_key"] == pd[1]["dedup_key"]
        assert pd[0]["payload"]["severity"] == "error" and pd[0]["payload"]["class"] == "startup_stall"
        # The exec hook: the event on stdin and in the environment
        calls = hook_calls(out)
        assert [c["stdin"]["event"] for c in calls] == ["incident", "recovered"]
        assert calls[0]["env"]["SGLANG_SUPERVISOR_EVENT"] == "incident"
        assert calls[0]["env"]["SGLANG_SUPERVISOR_BUNDLE"] == inc.bundle
        assert calls[0]["env"]["SGLANG_SUPERVISOR_INCIDENT_ID"] == inc.id
        # The failures: the hanging receiver timed out (two attempts), the 500 one was tried three times
        ledger = notes(s.paths.state_dir)
        by = {(n["target"], n["notified"]): n for n in ledger}
        assert by[("hangs", "incident")]["outcome"] == "failed" and by[("hangs", "incident")]["attempts"] == 2
        assert "timed out" in by[("hangs", "incident")]["error"]
        assert by[("fails", "incident")]["outcome"] == "failed" and by[("fails", "incident")]["status"] == 500
        assert by[("fails", "incident")]["attempts"] == 3 and len(failing.bodies("/x")) == 6
        assert len(hung.bodies("/x")) >= 2
        for target in ("team-json", "slack", "pager", "hook"):
            assert by[(target, "incident")]["outcome"] == "ok" and by[(target, "recovered")]["outcome"] == "ok"
        async with httpx.AsyncClient() as c:
            metrics = (await c.get(f"{r.api}/metrics")).text
            t0 = time.monotonic()
            assert (await c.get(f"{r.api}/status")).status_code == 200
            assert time.monotonic() - t0 < 2.0, "the API answers while deliveries hang"
        assert 'sglang_supervisor_notifications_total{event="incident",outcome="ok",target="team-json"} 1.0' in metrics
        assert 'sglang_supervisor_notifications_total{event="incident",outcome="failed",target="fails"} 1.0' in metrics
        assert 'sglang_supervisor_notifications_total{event="recovered",outcome="failed",target="hangs"} 1.0' in metrics


async def test_failed_is_told_to_the_hook(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out, argv = hook(tmp_path)
    s = with_notify(
        sim("crash_on_load", restart={"retries_per_rung": 0, "failed_cooldown_s": 0, "backoff_initial_s": 0.2}),
        NotifyTarget(name="hook", kind="exec", argv=argv, events=("failed", "recovered")),
    )
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "failed", 40, "failed")
    await until(lambda: len(notes(s.paths.state_dir)) >= 1, 20, "the hook told of failed")
    call = hook_calls(out)[0]
    assert call["stdin"]["event"] == "failed" and call["env"]["SGLANG_SUPERVISOR_EVENT"] == "failed"
    assert "FAILED" in call["stdin"]["summary"]
    assert [n["outcome"] for n in notes(s.paths.state_dir)] == ["ok"], "incidents were not asked for"


async def test_a_hook_that_hangs_is_killed_at_its_timeout(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(60)\n")
    s = with_notify(
        sim("crash_on_load", restart={"retries_per_rung": 0, "failed_cooldown_s": 0, "backoff_initial_s": 0.2}),
        NotifyTarget(name="slow", kind="exec", argv=(sys.executable, str(script)), timeout_s=0.5, retries=0),
    )
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "failed", 40, "failed")
    await until(lambda: any(n["notified"] == "failed" for n in notes(s.paths.state_dir)), 20, "the failed delivery")
    failed = next(n for n in notes(s.paths.state_dir) if n["notified"] == "failed")
    assert failed["outcome"] == "failed" and "timed out" in failed["error"]


def test_stayed_stopped_after_a_daemon_crash(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The operator stopped the server, then the daemon crashed: its successor leaves the server
    stopped and says so; the stop itself was told to nobody."""
    with receiver("ok") as (url, got):
        s = with_notify(sim("ok", tp=1), NotifyTarget(name="team", url=f"{url}/n"))
        cfg = tmp_path / "c.toml"
        cfg.write_text(to_toml(s))
        api = f"http://127.0.0.1:{s.api.port}"
        proc = start(cfg, dict(os.environ))
        try:
            wait_status(api, lambda x: x["state"] == "ready", 40, proc)
            assert httpx.post(f"{api}/stop", json={}, timeout=30).status_code == 202
            wait_status(api, lambda x: x["state"] == "stopped", 30, proc)
            proc.kill()
            proc.wait(10)
            assert got.bodies("/n") == [], "an operator's stop is not an incident"
            proc = start(cfg, dict(os.environ))
            deadline = time.monotonic() + 20
            while not got.bodies("/n") and time.monotonic() < deadline:
                time.sleep(0.1)
            [body] = got.bodies("/n")
            assert body["event"] == "stayed_stopped" and "stopped by request" in body["reason"]
            assert wait_status(api, lambda x: True, 10, proc)["state"] == "stopped"
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            finally:
                cleanup(proc, s.paths.state_dir)


def test_run_from_toml_a_killed_server_is_told_and_a_reload_moves_the_target(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`sglang-supervisor run` with [[notify]] in its TOML: SIGKILL the server, the receiver hears the
    incident and the recovery; a reload to a secret file anyone may read is refused and the old
    target stays; a good reload moves the events to the new target."""
    with receiver("ok") as (url, got):
        s = sim("ok", tp=1, restart={"retries_per_rung": 5, "max_restarts_per_hour": 50})
        first = private(tmp_path / "first-url", f"{url}/first")
        cfg = tmp_path / "c.toml"

        def write(url_file: str) -> None:
            cfg.write_text(to_toml(with_notify(s, NotifyTarget(name="team", url_file=url_file))))

        write(first)
        api = f"http://127.0.0.1:{s.api.port}"
        proc = start(cfg, dict(os.environ))
        try:
            st = wait_status(api, lambda x: x["state"] == "ready", 40, proc)
            os.kill(st["pid"], signal.SIGKILL)
            wait_status(api, lambda x: x["state"] == "ready" and x["pid"] != st["pid"], 40, proc)
            deadline = time.monotonic() + 20
            while len(got.bodies("/first")) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert [b["event"] for b in got.bodies("/first")] == ["incident", "recovered"]
            assert got.bodies("/first")[0]["incident"]["cause"] == "exited"

            loose = tmp_path / "loose-url"
            loose.write_text(f"{url}/loose\n")
            loose.chmod(0o644)
            write(str(loose))
            r = httpx.post(f"{api}/reload", json={}, timeout=30)
            assert r.status_code == 400 and "chmod 600" in r.json()["detail"]

            write(private(tmp_path / "second-url", f"{url}/second"))
            assert httpx.post(f"{api}/reload", json={}, timeout=30).status_code == 200
            st = wait_status(api, lambda x: x["state"] == "ready", 10, proc)
            os.kill(st["pid"], signal.SIGKILL)
            deadline = time.monotonic() + 40
            while len(got.bodies("/second")) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert [b["event"] for b in got.bodies("/second")] == ["incident", "recovered"]
            assert len(got.bodies("/first")) == 2 and got.bodies("/loose") == []
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            finally:
                cleanup(proc, s.paths.state_dir)
