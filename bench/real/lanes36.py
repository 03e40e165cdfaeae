"""Issue 36's lane on real SGLang (back to serving fast), one H200, about 8 minutes:

- a: a cold start: a fresh `[paths] cache_dir` (the daemon pins SGLang's kernel caches there) on a
  fresh machine; its `launch_timeline` (milestones, each phase's time).
- b: a serving stall (the scheduler SIGSTOPped under 4 clients): the outage in its parts
  (`/status` `last_outage`, journal `outage`) and the relaunch's timeline: the same rung, so a warm
  kernel cache (`cache.state` `hit`) against a's cold one, phase by phase.
- c: a start-up deadlock on the model this daemon has started twice (a new daemon on the same state
  directory, the one-shot lock in `alloc_memory_pool` armed through the server's environment, the
  shipped `startup_stall_s` 180 s): the learned window in force (`/status` `stall_window` while
  starting), the verdict's time after the onset (target under 30 s), the outage in its parts.
- d (when time is left): a cold launch again (another fresh `cache_dir`, the page cache now warm):
  the kernel caches' own share of a relaunch.

The warm-up request's phase (`warmup` -> `ready_line`) is in every timeline; stage `i36xid` (lane
`xid`, issue 24) journals the timeline of the relaunch after a real Xid, whose warm-up took 119 s.
Every figure comes from the daemon's journal and API. REAL_SIMULATE=1 runs the recipe on the
simulator (a CPU machine).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from bench.real import configs
from bench.real.lab import Daemon, Load, Recorder, free_port
from bench.real.scenarios import _fault_env, _recording, _signal_scheduler, _start, incident_record

LANE_BUDGET_S = 480.0  # part d only starts with this much of the lane still unspent
D_NEEDS_S = 150.0
KEEP = ("launch_timeline", "outage", "kernel_cache", "weights_residency", "server_ready", "incident")


def _simulated() -> bool:
    return os.environ.get("REAL_SIMULATE") == "1"


def _deadlock_env(work: Path) -> dict[str, str]:
    if _simulated():
        return {"SGLANG_SIM_SCENARIO": "deadlock_after_load", "SGLANG_SIM_FAULT_ONCE": "1",
                "SGLANG_SIM_ONSET_FILE": str(work / "fault.onset")}
    return _fault_env(work)


def _onset(work: Path, timeout: float = 300.0) -> float:
    """The fault's wall time: the injection writes a float, the simulator a JSON record."""
    f = work / "fault.onset"
    end = time.time() + timeout
    while time.time() < end:
        try:
            text = f.read_text().strip()
            if text:
                return float(json.loads(text)["onset_wall"]) if text.startswith("{") else float(text)
        except (OSError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.2)
    return time.time()


def _config(real: Path, models: Path, gpu: str, *, env_extra: dict[str, str] | None = None,
            cache_dir: Path | None = None) -> dict[str, Any]:
    wd = dict(configs.FAST, startup_stall_s=180.0, cpu_only_stall_s=900.0)  # the shipped start-up windows
    cfg = configs.config(real, models, gpus=gpu, watchdog=wd, env_extra=env_extra, inject=env_extra is not None,
                         fallbacks=False)
    # backoff and the hung tree's grace as shipped; 3 retries, as c follows b within `stable_s`
    cfg["restart"].update({"backoff_initial_s": 1.0, "hung_stop_grace_s": 1.0, "retries_per_rung": 3})
    if cache_dir is not None:
        cfg["paths"] = {"cache_dir": str(cache_dir)}
    cfg["server"]["port"] = free_port()
    return cfg


def _kept(d: Daemon) -> list[dict[str, Any]]:
    return [e for e in d.events() if e.get("event") in KEEP]


def _watch_windows(d: Daemon, until: float) -> list[dict[str, Any]]:
    """`stall_window` as /status shows it while starting, each change once, until the verdict."""
    seen: list[dict[str, Any]] = []
    while time.time() < until:
        st = d.status()
        w = st.get("stall_window")
        if w and (not seen or seen[-1] != w):
            seen.append(w)
        if st.get("state") in ("hung", "diagnosing", "restarting", "failed"):
            break
        time.sleep(0.5)
    return seen


def lane_fast(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    t0 = time.time()
    res: dict[str, Any] = {"lane": "fast", "gpu": gpu, "simulated": _simulated()}
    d = Daemon(work, _config(real, models, gpu), configs.daemon_env(real))
    rec = Recorder(d).start()
    with _recording(res, d, rec):
        res["a_cold_start"] = _start(d, rec)
        res["a_timeline"] = d.status().get("launch_timeline")
        load = Load(int(d.config["server"]["port"]))
        time.sleep(10)
        onset = time.time()
        res["b_victim"] = _signal_scheduler(d, signal.SIGSTOP)
        b = incident_record(d, onset)
        b.pop("events", None)
        res["b_serving_stall"] = b
        st = d.status()
        res["b_outage"], res["b_timeline"] = st.get("last_outage"), st.get("launch_timeline")
        res["b_load"] = load.stop()
        res["ab_journal"] = _kept(d)
    os.replace(work / "daemon.log", work / "daemon-ab.log")
    # c: a new daemon, the same state directory (launches.json, cache/), the deadlock armed once
    d2 = Daemon(work, _config(real, models, gpu, env_extra=_deadlock_env(work)), configs.daemon_env(real))
    rec2 = Recorder(d2).start()
    c: dict[str, Any] = {}
    res["c"] = c
    with _recording(c, d2, rec2):
        c["windows"] = _watch_windows(d2, time.time() + 240.0)
        onset = _onset(work)
        rec_c = incident_record(d2, onset)
        rec_c.pop("events", None)
        c["deadlock"] = rec_c
        st = d2.status()
        c["outage"], c["timeline"] = st.get("last_outage"), st.get("launch_timeline")
        c["journal"] = _kept(d2)
        c["check_config"] = (work / "check-config.txt").read_text()[-3000:]
    left = LANE_BUDGET_S - (time.time() - t0)
    res["d_skipped"] = left < D_NEEDS_S
    if not res["d_skipped"]:
        os.replace(work / "daemon.log", work / "daemon-c.log")
        d3 = Daemon(work, _config(real, models, gpu, cache_dir=work / "cache-cold"), configs.daemon_env(real))
        rec3 = Recorder(d3).start()
        dd: dict[str, Any] = {}
        res["d"] = dd
        with _recording(dd, d3, rec3):
            dd["cold_start"] = _start(d3, rec3)
            dd["timeline"] = d3.status().get("launch_timeline")
    res["lane_s"] = round(time.time() - t0, 1)
    return res


LANES = {"fast": lane_fast}
