"""Issue 49's lane on one GPU (stage `i49` of device.sh, about 10 minutes): the recovery policy on
real SGLang 0.5.16 (EAGLE-3, tiny models), a short fault script under the daemon.

- a: a failed promote. The base rung deadlocks after the load on every launch (`REAL_FAULT=kv_deadlock`
  in the server's env, not one-shot: the lock in `ModelRunner.alloc_memory_pool`); the fallback rung
  `no-cuda-graph` (`--disable-cuda-graph`) sets `REAL_FAULT=off`, so it serves. The daemon starts,
  walks base (its one retry) down to `no-cuda-graph`; once that serves, `POST /promote` with `{}`.
  Recorded: the launches after the promote (expected: exactly `base`, then `no-cuda-graph`), the
  `ladder_decision` after the promote's incident (expected: backoff 0, "back to rung no-cuda-graph"),
  the time from the promote to serving again, and the journal's `outage` records (the requested one,
  `ended_by` the hang, and the hang's own).
- b: a second, unrelated fault on the rung that served: the server's main process (the HTTP front end)
  SIGSTOPped under four clients (the daemon stops the tree; no SIGCONT; the clients stop with the old
  tree, so the relaunch's warm-up is not slowed by early traffic). Expected: the relaunch on the
  same rung with backoff 0 ("keeps its standing"); recorded with the outage record's parts.
- c (when time is left): the daemon's own CPU (% of a core) and RSS, and its log keeper's, over 60 s
  of serving four clients with the shipped intervals (poll 2 s, health 10 s, metrics 5 s).

Windows: shipped intervals; `startup_stall_s` 30 (a fresh state directory has no learned window and
the shipped 180 s would make the script too long for a device call) and `health_timeout_s` 10.
`retries_per_rung` 1 as shipped, so the code before issue 49 would have retried base after the
failed promote. With REAL_SIMULATE=1 it runs on the simulator (`deadlock_after_load`, not one-shot).
The lane writes `result.json` after each part, so a lane killed at the plan's deadline keeps them.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.real import configs
from bench.real.lab import Daemon, Load, Recorder, free_port, iso, own_cost, ts
from bench.real.lanes36 import _onset
from bench.real.scenarios import _events_between, _recording, incident_record

SIMULATE = os.environ.get("REAL_SIMULATE") == "1"
WATCH: dict[str, Any] = {"startup_stall_s": 30.0, "health_timeout_s": 10.0}  # the rest as shipped
LANE_BUDGET_S = float(os.environ.get("REAL_I49_BUDGET_S", "600"))  # part c starts only inside it
OVERHEAD_S = float(os.environ.get("REAL_I49_OVERHEAD_S", "60"))
# 1 as shipped (the code before issue 49 then retried base after the failed promote); 0 saves one
# base deadlock (about 90 s on a GPU) where a device call is short.
RETRIES = int(os.environ.get("REAL_I49_RETRIES", "1"))
FALLBACK = "no-cuda-graph"
KEEP = ("server_launched", "server_ready", "incident", "ladder_decision", "outage", "state_changed")


def _fault_env(work: Path) -> dict[str, str]:
    if SIMULATE:
        return {"SGLANG_SIM_SCENARIO": "deadlock_after_load", "SGLANG_SIM_ONSET_FILE": str(work / "fault.onset")}
    return {"REAL_FAULT": "kv_deadlock", "REAL_FAULT_ONSET": str(work / "fault.onset")}


def _no_fault(work: Path) -> dict[str, str]:
    if SIMULATE:
        return {"SGLANG_SIM_SCENARIO": "ok", "SGLANG_SIM_ONSET_FILE": str(work / "ok.onset")}
    return {"REAL_FAULT": "off"}


def _config(real: Path, models: Path, gpu: str, work: Path) -> dict[str, Any]:
    cfg = configs.config(real, models, gpus=gpu, watchdog=dict(WATCH), env_extra=_fault_env(work),
                         inject=not SIMULATE, fallbacks=False)
    ok = _no_fault(work)
    cfg["fallback"] = [
        {"name": FALLBACK, "args": {"disable-cuda-graph": True}, "drop": ["cuda-graph-max-bs"],
         "on": ["cuda_graph_capture"], "env": ok},
        {"name": "no-speculation", "drop": configs.SPEC_KEYS, "on": ["spec_regression"], "env": ok},
    ]
    cfg["restart"].update({"retries_per_rung": RETRIES, "failed_cooldown_s": 0.0})
    cfg["server"]["port"] = free_port()
    return cfg


def _brief(e: dict[str, Any]) -> dict[str, Any]:
    keep = ("ts", "event", "rung", "action", "reason", "backoff_s", "cause", "hang_class", "id", "incident",
            "total_s", "parts", "daemon_s", "ended_by", "new", "old", "detail", "time_to_ready_s")
    return {k: e[k] for k in keep if k in e}


def _named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [_brief(e) for e in events if e.get("event") == name]


def _save(work: Path, res: dict[str, Any]) -> None:
    (work / "result.json").write_text(json.dumps(res, indent=1, default=str))


def _wait_served_on(d: Daemon, rung: str, timeout: float) -> dict[str, Any]:
    return d.wait(lambda s: s.get("state") in ("ready", "degraded") and s.get("rung") == rung, timeout, 0.5)


def _ready_after(events: list[dict[str, Any]], t: float) -> float | None:
    for e in events:
        at = ts(e)
        if e.get("event") == "server_ready" and at is not None and at >= t:
            return at
    return None


def part_a(d: Daemon, work: Path, res: dict[str, Any]) -> None:
    """Serve on the fallback after base's walk, then a promote that fails."""
    t0 = d.started
    st = _wait_served_on(d, FALLBACK, 720.0)
    ev = d.events()
    res["a_start"] = {
        "serving_s": round(time.time() - t0, 1), "rung": st.get("rung"),
        "launches": [e.get("rung") for e in ev if e.get("event") == "server_launched"],
        "decisions": _named(ev, "ladder_decision"), "outages": _named(ev, "outage"),
    }
    _save(work, res)
    time.sleep(5)
    before = len([e for e in d.events() if e.get("event") == "server_launched"])
    seen: list[str] = []

    def back(s: dict[str, Any]) -> bool:
        rung = s.get("rung")
        if rung and (not seen or seen[-1] != rung):
            seen.append(str(rung))
        return "base" in seen and s.get("state") in ("ready", "degraded") and rung == FALLBACK

    t_promote = time.time()
    answer = d.post("/promote", {})
    try:
        d.wait(back, 600.0, 0.5)
    except (TimeoutError, RuntimeError) as err:
        res["a_error"] = repr(err)
    t_seen = time.time()
    ev = d.events()
    after = _events_between(ev, t_promote - 0.5)
    launched = [e.get("rung") for e in ev if e.get("event") == "server_launched"][before:]
    decisions = _named(after, "ladder_decision")
    incidents = _named(after, "incident")
    onset = _onset(work, timeout=2.0)
    ready_at = _ready_after(after, t_promote)
    verdict = next((e for e in after if e.get("event") == "incident" and e.get("cause") != "manual"), None)
    res["a_promote"] = {
        "promoted_at": iso(t_promote),
        "answer": answer,
        "rungs_seen": seen,
        "launches_after": launched,
        "launches_as_expected": launched == ["base", FALLBACK],
        "decisions": decisions,
        "decision_after_incident": decisions[-1] if decisions else None,
        "back_with_no_backoff": bool(decisions) and decisions[-1].get("backoff_s") == 0.0
        and f"back to rung {FALLBACK}" in str(decisions[-1].get("reason")),
        "incidents": incidents,
        "fault_onset": iso(onset),
        "detect_s": round(at - onset, 2) if (at := ts(verdict)) is not None else None,
        "promote_to_serving_s": round(ready_at - t_promote, 1) if ready_at else None,
        "promote_to_status_ready_s": round(t_seen - t_promote, 1),
        "outages": _named(after, "outage"),
        "last_outage": d.status().get("last_outage"),
    }
    _save(work, res)


def _stop_load_when_gone(pid: int, load: Load, out: list[dict[str, Any]]) -> None:
    """The clients stop once the daemon has stopped the old tree, as a balancer that routes by
    readiness would: traffic that reaches a relaunch before SGLang's own warm-up request brings on
    minutes of compilation (docs/BENCHMARKS.md, issue 36's H100 run), which is not the policy's."""
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.Error:
            break
        time.sleep(0.2)
    out.append({**load.stop(), "stopped_at": iso(time.time())})


def part_b(d: Daemon, work: Path, res: dict[str, Any]) -> None:
    """The front end SIGSTOPped under four clients on the rung that served."""
    load = Load(int(d.config["server"]["port"]))
    time.sleep(10)
    st = d.status()
    main = int(st["pid"])
    res["b_load_before"] = {"ok": load.ok, "failed": load.failed, "rung": st.get("rung")}
    onset = time.time()
    os.kill(main, signal.SIGSTOP)
    loads: list[dict[str, Any]] = []
    threading.Thread(target=_stop_load_when_gone, args=(main, load, loads), daemon=True).start()
    rec = incident_record(d, onset, ready_timeout=420.0)
    events = rec.pop("events", None) or []
    bundle = rec.pop("bundle", None) or {}
    text = bundle.get("summary_txt") or ""
    rec["first_line"] = text.splitlines()[0] if text else ""
    rec["outages"] = _named(events, "outage")
    rec["decisions"] = _named(events, "ladder_decision")
    rec["launches"] = [e.get("rung") for e in events if e.get("event") == "server_launched"]
    rec["keeps_standing"] = (
        bool(rec["decisions"]) and rec["decisions"][0].get("backoff_s") == 0.0
        and "keeps its standing" in str(rec["decisions"][0].get("reason")) and rec["launches"][:1] == [FALLBACK]
    )
    rec["victim"] = {"pid": main, "role": "main", "rung": st.get("rung")}
    rec["last_outage"] = d.status().get("last_outage")
    res["b_frontstop"] = rec
    res["b_load"] = loads[0] if loads else load.stop()
    _save(work, res)


def part_c(d: Daemon, work: Path, res: dict[str, Any]) -> None:
    """The daemon's and its log keeper's CPU and RSS over OVERHEAD_S of four clients."""
    _wait_served_on(d, FALLBACK, 300.0)
    load = Load(int(d.config["server"]["port"]))
    time.sleep(10)
    out = own_cost(d.proc.pid, OVERHEAD_S)
    out["intervals"] = "shipped (poll 2 s, health 10 s, metrics 5 s)"
    st = d.status()
    out["state"], out["incidents"], out["rung"] = st.get("state"), st.get("incidents"), st.get("rung")
    out["load"] = load.stop()
    res["c_overhead"] = out
    _save(work, res)


def lane_recovery(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res: dict[str, Any] = {"lane": "recovery", "gpu": gpu, "simulated": SIMULATE, "watchdog": WATCH,
                           "retries_per_rung": RETRIES}
    d = Daemon(work, _config(real, models, gpu, work), configs.daemon_env(real))
    rec = Recorder(d, every=1.0).start()
    with _recording(res, d, rec):
        part_a(d, work, res)
        part_b(d, work, res)
        left = LANE_BUDGET_S - (time.time() - t0)
        res["c_skipped"] = left < OVERHEAD_S + 40
        if not res["c_skipped"]:
            res["timeline"] = rec.stop()  # its /status reads would be counted as the daemon's own cost
            part_c(d, work, res)
    events = res["close"].get("events", [])
    res["journal"] = [_brief(e) for e in events if e.get("event") in KEEP]
    res["close"] = {k: v for k, v in res["close"].items() if k != "events"}
    res["lane_s"] = round(time.time() - t0, 1)
    return res


LANES = {"recovery": lane_recovery}
