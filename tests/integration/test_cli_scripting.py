"""The CLI as a script or an operator on call uses it, as real `sglang-supervisor` processes against the
running daemon and the real simulator: exit codes by state, `--wait`, `status --watch`, `logs -f`,
`events --follow`, an unknown event name, and a config with a typo outside `[api]`."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from cliproc import Follower, cli, cli_env

from supervisor.config.render import dump_toml

pytestmark = pytest.mark.integration
async def test_exit_codes_by_state_and_wait_on_stop_start_restart(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok", env={"SGLANG_SIM_PACE": "0.3"}))
    code, out, _ = await cli("status", "--url", r.api)
    # starting: 6, as documented; on a loaded machine the CLI's own start can outlast the 6 s load,
    # so the code is checked against the state the CLI printed (tests/supervisor/client pins each).
    assert out.startswith("state"), out
    assert (code, "starting" in out) in ((6, True), (0, False)) and ("ready" in out) == (code == 0), (code, out)
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")
    assert (await cli("status", "--url", r.api, "--json"))[0] == 0

    code, out, err = await cli("stop", "--url", r.api, "--wait")
    assert code == 0, out + err
    assert out.splitlines()[0] == "stop accepted (stopping); waiting for it"  # no hint to pass --wait (issue 53)
    # No NVML on this machine: the stop is verified for the tree and the port, and says the GPU was not.
    assert out.splitlines()[-1] == "stop: stopped; port free; GPU release unverified (NVML unavailable here)"
    assert r.snap().state == "stopped"
    code, out, _ = await cli("status", "--url", r.api)
    assert code == 8 and "stopped" in out

    code, out, err = await cli("start", "--url", r.api, "--wait")
    assert code == 0, out + err
    snap = r.snap()
    assert snap.state == "ready" and out.splitlines()[-1] == f"start: ready on rung base, pid {snap.pid}"

    old_pid = snap.pid
    code, out, err = await cli("restart", "--url", r.api, "--wait", "--reason", "scripted")
    assert code == 0, out + err
    snap = r.snap()
    assert snap.pid != old_pid and out.splitlines()[-1] == f"restart: ready on rung base, pid {snap.pid}"
    assert "state ready" not in out.splitlines()[0]  # the state before the restart is not shown as its result

    code, out, _ = await cli("restart", "--url", r.api, "--wait", "--wait-timeout", "0.5", "--json")
    assert code == 124, out
    doc = json.loads(out)
    assert doc["exit"] == 124 and doc["answer"]["incident_id"] and "still " in doc["outcome"]
    await r.wait_for(lambda x: x.state == "ready", 60, "ready again")


async def test_wait_ends_in_failed_with_its_own_code(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok")
    cfg = tmp_path / "config.toml"
    cfg.write_text(dump_toml(s))
    r = await daemon(s, config_path=cfg)
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")
    # The only rung crashes on load from now on and the budget is one restart: `failed`, exit 9.
    code, out, err = await cli("stop", "--url", r.api, "--wait")
    assert code == 0, out + err
    crashing = s.model_copy(
        update={
            "server": s.server.model_copy(update={"env": {**s.server.env, "SGLANG_SIM_SCENARIO": "crash_on_load"}}),
            "restart": s.restart.model_copy(update={"max_restarts_per_hour": 1}),
        }
    )
    cfg.write_text(dump_toml(crashing))
    code, out, err = await cli("reload", "--url", r.api)
    assert code == 0, out + err
    code, out, err = await cli("start", "--url", r.api, "--wait", "--wait-timeout", "90")
    assert code == 9, out + err
    assert "start: failed" in err
    code, _, _ = await cli("status", "--url", r.api)
    assert code == 9


async def test_watch_logs_follow_and_events_follow_stream_from_the_daemon(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    secret = "s3cr3t-passw0rd-9"
    r = await daemon(sim("ok", args={"model-path": f"https://hf:{secret}@models.example/llama"}))
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")

    code, out, _ = await cli("logs", "--url", r.api, "-n", "400")
    assert code == 0 and "server_args=ServerArgs(" in out
    assert secret not in out and "hf:[redacted]@models.example" in out  # the server echoes it; the API does not

    events = await Follower.start("events", "--url", r.api, "--follow", "--event", "state_changed", "--limit", "1")
    logs = await Follower.start("logs", "--url", r.api, "-f", "-n", "0")
    watch = await Follower.start("status", "--url", r.api, "--watch", "0.5")
    try:
        await events.until(lambda x: "new=ready" in x, 20)  # the last matching event, then it keeps following
        await watch.until(lambda x: x.startswith("state") and "ready" in x, 20)
        async with httpx.AsyncClient(timeout=30) as c:
            assert (await c.post(f"{r.api}/restart", json={"reason": "follow test"})).status_code == 202
        await events.until(lambda x: "new=restarting" in x and "manual" in x, 30)
        await events.until(lambda x: "new=ready" in x, 60)
        # The new server's start-up lines arrive through the open answer, as they are written.
        line = await logs.until(lambda x: "server_args=ServerArgs(" in x, 30)
        assert secret not in line
        await watch.until(lambda x: x.startswith("last incident") and "manual" in x, 30)
        await watch.until(lambda x: x.startswith("state") and "ready" in x, 30)
        assert not any(x.startswith("{") for x in events.lines)  # formatted for a person, not raw JSON
    finally:
        codes = [await events.interrupt(), await logs.interrupt(), await watch.interrupt()]
    assert codes == [0, 0, 0]  # Ctrl-C ends a follow cleanly; a watch exits with the state's code (ready: 0)


async def test_an_unknown_event_name_is_refused_with_the_known_ones(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok"))
    code, out, err = await cli("events", "--url", r.api, "--event", "incidents")
    assert code == 1 and out == ""
    assert "HTTP 422" in err and "unknown event name incidents" in err and "incident," in err
    async with httpx.AsyncClient(timeout=10) as c:
        body = (await c.get(f"{r.api}/events", params={"event": "incidents"})).json()
    assert body["error"] == "unknown_event" and "incident" in body["events"] and "state_changed" in body["events"]


async def test_a_typo_outside_api_does_not_stop_status_or_reload(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok")
    await daemon(s)
    cfg = tmp_path / "typo.toml"
    cfg.write_text(dump_toml(s).replace("[watchdog]", "[watchdog]\nstartup_stal_s = 5"))
    code, out, err = await cli("status", "--config", str(cfg))
    assert code in (0, 6) and "state" in out, out + err
    env = {**cli_env(), "SGLANG_SUPERVISOR_CONFIG": str(cfg)}  # no --config: the variable names it
    assert (await cli("status", "--json", env=env))[0] in (0, 6)
    # The daemon, not the client, refuses the file, naming the key (it has no config path in this test).
    code, out, err = await cli("reload", env=env)
    assert code == 1 and "no config file to reload" in err, out + err
    cfg.write_text(dump_toml(s).replace("[api]", "[api]\nprot = 1"))
    code, out, err = await cli("status", "--config", str(cfg))
    assert code in (0, 6) and "ignoring unknown key api.prot" in err
    cfg.write_text(dump_toml(s).replace(f"port = {s.api.port}", 'port = "x"'))
    code, _, err = await cli("status", "--config", str(cfg))
    assert code == 2 and "api.port" in err


async def test_a_follow_ends_when_the_daemon_stops(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok"))
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    follower = await Follower.start("events", "--url", r.api, "--follow", "--event", "server_ready", "--limit", "1")
    await follower.until(lambda x: " server_ready " in x, 20)
    started = time.monotonic()
    assert await r.stop() == 0  # an open stream does not hold the daemon's shutdown
    # The answer ends and the client says why, with the code for "the daemon is not there" (3).
    assert await asyncio.wait_for(follower.proc.wait(), 20) == 3
    assert follower.proc.stderr is not None
    assert b"the daemon closed the stream" in await follower.proc.stderr.read()
    assert time.monotonic() - started < 20


async def test_stop_wait_reports_what_nvml_showed(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """With NVML answering (faked from a file, as in test_gpu_attribution.py): a released GPU is
    "verified", memory still held by the old tree after the stop is exit 1 and named."""
    from gpufile import GB, write_nvml

    nvml = tmp_path / "nvml.json"
    write_nvml(nvml, {})
    s = sim("ok", restart={"release_timeout_s": 1.0}, gpu=nvml)
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    code, out, err = await cli("stop", "--url", r.api, "--wait")
    assert code == 0 and out.splitlines()[-1] == "stop: stopped; port free, GPU memory released (verified by NVML)"

    code, out, err = await cli("start", "--url", r.api, "--wait")
    assert code == 0, out + err
    pid = r.snap().pid
    assert pid is not None
    write_nvml(nvml, {pid: 40 * GB})  # the driver still shows the old main process holding memory
    code, out, err = await cli("stop", "--url", r.api, "--wait")
    assert code == 1 and "GPU memory is still held by the old tree" in err, out + err
    code, out, _ = await cli("status", "--url", r.api)
    assert code == 8 and "last stop" in out and "GPU held" in out


async def test_watch_json_is_one_status_document_per_line(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    r = await daemon(sim("ok"))
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    watch = await Follower.start("status", "--url", r.api, "--watch", "0.3", "--json")
    try:
        first = json.loads(await watch.until(lambda x: x.startswith("{"), 20))
        second = json.loads(await watch.until(lambda x: x.startswith("{"), 20))
    finally:
        code = await watch.interrupt()
    assert first["state"] == second["state"] == "ready" and first["pid"] == r.snap().pid
    assert code == 0 and all(x.startswith("{") for x in watch.lines)  # nothing but JSON for a machine
