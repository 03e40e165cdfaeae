"""The fault matrix on real SGLang, one lane per GPU, the daemon supervising `sglang.launch_server`.

Each lane is one daemon walking several scenarios in a row (a relaunch is 80 s of real start-up, so
lanes reuse the server an incident's recovery brought up). Every figure comes from the daemon's
own journal (`/events`) and API, plus the wall time at which the recipe did something to the server.

- lane `serve`  (a, c, d): clean start to ready with the phase timeline; a scheduler SIGSTOPped under
  load (`serving_stall`); a scheduler SIGKILLed under load (`rank_died`, and SGLang's own SIGQUIT path).
- lane `ladder` (e, g, f): a real lock deadlock in `ModelRunner.alloc_memory_pool` after the weights
  load, injected through the server's environment (`startup_stall`, `idle_deadlock`); the ladder walked
  to `no-cuda-graph`; the random draft's acceptance 1.0 with `on_spec_regression = "fallback"` taking
  the service to `no-speculation`, which serves.
- lane `piecewise` (b): default flags (piecewise prefill CUDA graphs and their silent first
  compilation) under the shipped default windows: zero incidents, and the margin left.
- lane `tp2` (issue 15): tensor parallelism 2 over two GPUs: start to ready with roles and per-GPU
  memory, then rank 1 SIGSTOPped under load.
- lane `tp2_deadlock` (issue 15): a start-up deadlock in rank 1 only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.real import configs
from bench.real.lab import Daemon, Load, Recorder, free_port, iso, schedulers, title, titles, ts


@contextlib.contextmanager
def _recording(res: dict[str, Any], d: Daemon, rec: Recorder) -> Iterator[None]:
    """A lane keeps what it measured when a step fails, and always stops its server and daemon."""
    try:
        yield
    except Exception as err:
        res["error"] = repr(err)
    finally:
        res["timeline"] = rec.stop()
        res["close"] = d.close()


def _fault_env(work: Path, rank: str | None = None) -> dict[str, str]:
    env = {"REAL_FAULT": "kv_deadlock", "REAL_FAULT_ONCE": str(work / "fault.once"),
           "REAL_FAULT_ONSET": str(work / "fault.onset")}
    return {**env, "REAL_FAULT_RANK": rank} if rank is not None else env


def _new_daemon(work: Path, cfg: dict[str, Any], real: Path) -> Daemon:
    cfg["server"]["port"] = free_port()
    return Daemon(work, cfg, configs.daemon_env(real))


def _events_between(events: list[dict[str, Any]], start: float, end: float | None = None) -> list[dict[str, Any]]:
    out = []
    for e in events:
        t = ts(e)
        if t is not None and t >= start and (end is None or t <= end):
            out.append(e)
    return out


def _first(events: list[dict[str, Any]], name: str, **match: Any) -> dict[str, Any] | None:
    for e in events:
        if e.get("event") == name and all(e.get(k) == v for k, v in match.items()):
            return e
    return None


def _since(a: float | None, b: float | None) -> float | None:
    return round(b - a, 3) if a is not None and b is not None else None


def incident_record(d: Daemon, onset: float, *, ready_timeout: float = 420.0,
                    incident_timeout: float = 300.0) -> dict[str, Any]:
    """After a fault at `onset`: wait for the incident and the relaunch to be ready; time each step."""
    before = (d.status().get("last_incident") or {}).get("id")
    out: dict[str, Any] = {"onset": iso(onset)}
    try:
        d.wait_incident(before, incident_timeout)
    except (TimeoutError, RuntimeError) as err:
        out["error"] = f"no incident: {err}"
        return out
    if ready_timeout <= 0:  # only the verdict, the evidence and the stop: wait for the relaunch to begin
        try:
            d.wait(lambda s: s.get("state") in ("starting", "failed", "stopped"), 300.0)
        except (TimeoutError, RuntimeError) as err:
            out["relaunch_error"] = repr(err)
    else:
        try:
            ready = d.wait_ready(ready_timeout)
            out["ready_rung"] = ready.get("rung")
            out["time_to_ready_s"] = ready.get("time_to_ready_s")
        except (TimeoutError, RuntimeError) as err:
            out["relaunch_error"] = repr(err)
    ev = _events_between(d.events(), onset - 1.0)
    moves = (e for e in ev if e.get("event") == "state_changed" and e.get("new") in ("hung", "restarting"))
    verdict = next(moves, None)
    inc = _first(ev, "incident")
    bundle = _first(ev, "bundle_written")
    stopped = _first(ev, "server_stopped")
    launched = _first(ev, "server_launched")
    ready_ev = next((e for e in ev if e.get("event") == "server_ready" and launched and ts(e) and ts(launched)
                     and ts(e) >= ts(launched)), None)
    decision = _first(ev, "ladder_decision")
    out.update({
        "verdict_at": verdict.get("ts") if verdict else None,
        "detect_s": _since(onset, ts(verdict)),
        "cause": inc.get("cause") if inc else None,
        "hang_class": inc.get("hang_class") if inc else None,
        "detail": inc.get("detail") if inc else None,
        "bundle_id": inc.get("bundle") if inc else None,
        "bundle_s": bundle.get("duration_s") if bundle else None,
        "stop_s": stopped.get("stop_s") if stopped else None,
        "gpu_released": stopped.get("gpu_released") if stopped else None,
        "gpu_check": stopped.get("gpu_check") if stopped else None,
        "release_wait_s": stopped.get("release_wait_s") if stopped else None,
        "survivors": stopped.get("survivors") if stopped else None,
        "port_free": stopped.get("port_free") if stopped else None,
        "decision": {k: decision.get(k) for k in ("action", "rung", "reason", "backoff_s")} if decision else None,
        "relaunch_rung": launched.get("rung") if launched else None,
        "onset_to_ready_s": _since(onset, ts(ready_ev)),
        "events": ev,
    })
    if out.get("bundle_id"):
        out["bundle"] = d.bundle(str(out["bundle_id"]))
    return out


def _start(d: Daemon, rec: Recorder) -> dict[str, Any]:
    t0 = time.time()
    st = d.wait_ready()
    return {"launched": iso(t0), "ready_s": round(time.time() - t0, 1), "time_to_ready_s": st.get("time_to_ready_s"),
            "rung": st.get("rung"), "incidents": st.get("incidents"), "processes": st.get("processes"),
            "gpu": st.get("gpu"), "titles": titles(int(st["pid"])) if st.get("pid") else []}


def _phases(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The timeline folded into phases: when each began, how long, which channels moved in it."""
    out: list[dict[str, Any]] = []
    for r in rows:
        key = r["state"] if r["state"] != "starting" else f"starting/{r['phase']}"
        if not out or out[-1]["phase"] != key:
            out.append({"phase": key, "from": r["t"], "to": r["t"], "channels": set(), "max_quiet_s": 0.0})
        cur = out[-1]
        cur["to"] = r["t"]
        cur["channels"].update(r.get("channels") or ())
        if r.get("last_progress_s") is not None:
            cur["max_quiet_s"] = max(cur["max_quiet_s"], float(r["last_progress_s"]))
    for p in out:
        p["seconds"] = round(p["to"] - p["from"], 1)
        p["channels"] = sorted(p["channels"])
        p["max_quiet_s"] = round(p["max_quiet_s"], 1)
    return out


def _signal_scheduler(d: Daemon, sig: signal.Signals, rank: int = -1) -> dict[str, Any]:
    st = d.status()
    scheds = schedulers(int(st["pid"]))
    victim = scheds[rank]
    os.kill(victim.pid, sig)
    return {"pid": victim.pid, "title": title(victim), "schedulers": len(scheds)}


def _serve(work: Path, real: Path, models: Path, gpu: str, *, name: str, kill: bool) -> dict[str, Any]:
    """a and c; with `kill`, c's relaunch is waited for and d follows (lane `serve`), else the lane
    ends with c's verdict, bundle and stop (lane `stall`, a short re-run)."""
    res: dict[str, Any] = {"lane": name, "gpu": gpu}
    d = _new_daemon(work, configs.config(real, models, gpus=gpu, watchdog=dict(configs.FAST)), real)
    rec = Recorder(d).start()
    with _recording(res, d, rec):
        res["a_start"] = _start(d, rec)
        res["a_start"]["phases"] = _phases(list(rec.rows))
        load = Load(int(d.config["server"]["port"]))
        time.sleep(15)
        res["c_load_before"] = {"ok": load.ok, "failed": load.failed}
        onset = time.time()
        res["c_victim"] = _signal_scheduler(d, signal.SIGSTOP)
        res["c_sigstop"] = incident_record(d, onset, ready_timeout=420.0 if kill else 0)
        if kill:
            time.sleep(10)
            onset = time.time()
            res["d_victim"] = _signal_scheduler(d, signal.SIGKILL)
            res["d_sigkill"] = incident_record(d, onset)
        res["load"] = load.stop()
    return res


def lane_serve(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    return _serve(work, real, models, gpu, name="serve", kill=True)


def lane_stall(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    return _serve(work, real, models, gpu, name="stall", kill=False)


def _deadlock_daemon(work: Path, real: Path, models: Path, gpu: str, **watchdog: Any) -> tuple[Daemon, Recorder]:
    """The base rung with the one-shot lock in `alloc_memory_pool` armed through the server's env."""
    wd = dict(configs.FAST, startup_stall_s=30.0, **watchdog)
    cfg = configs.config(real, models, gpus=gpu, watchdog=wd, env_extra=_fault_env(work), inject=True)
    d = _new_daemon(work, cfg, real)
    return d, Recorder(d).start()


def _scenario_e(d: Daemon, work: Path, *, ready_timeout: float) -> dict[str, Any]:
    out = incident_record(d, _wait_onset(work), ready_timeout=ready_timeout)
    out["frames_naming_alloc_memory_pool"] = _bundle_grep(d, out.get("bundle_id"), "alloc_memory_pool")
    return out


def lane_deadlock(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    """e only, not waiting for the relaunch: the verdict and bundle of the real lock deadlock."""
    res: dict[str, Any] = {"lane": "deadlock", "gpu": gpu}
    d, rec = _deadlock_daemon(work, real, models, gpu)
    with _recording(res, d, rec):
        res["e_deadlock"] = _scenario_e(d, work, ready_timeout=0)
    return res


def lane_ladder(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    res: dict[str, Any] = {"lane": "ladder", "gpu": gpu}
    d, rec = _deadlock_daemon(work, real, models, gpu, on_spec_regression="fallback", spec_window_s=20.0)
    with _recording(res, d, rec):
        res["e_deadlock"] = _scenario_e(d, work, ready_timeout=420.0)
        st = d.status()
        res["rungs_ready"] = [st.get("rung")]
        if st.get("rung") == "base":
            t0 = time.time()
            res["g_manual"] = d.post("/restart", {"rung": "no-cuda-graph", "reason": "walk the ladder"})
            time.sleep(2)
            st = d.wait_ready()
            res["g_no_cuda_graph_ready_s"] = round(time.time() - t0, 1)
            res["rungs_ready"].append(st.get("rung"))
        port = int(d.config["server"]["port"])
        load = Load(port)
        onset = time.time()
        res["f_spec"] = incident_record(d, onset)
        time.sleep(2)
        st = d.wait_ready()
        res["rungs_ready"].append(st.get("rung"))
        ok_before = load.ok
        time.sleep(10)
        res["f_served_on_fallback"] = {"rung": d.status().get("rung"), "requests_ok": load.ok - ok_before}
        res["load"] = load.stop()
        res["accept_seen"] = sorted({r["accept"] for r in rec.rows if r.get("accept") is not None})
    res["launches"] = [
        {"rung": e.get("rung"), "argv": e.get("argv"), "ts": e.get("ts")}
        for e in res["close"].get("events", []) if e.get("event") == "server_launched"
    ]
    return res


def lane_piecewise(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    res: dict[str, Any] = {"lane": "piecewise", "gpu": gpu}
    cfg = configs.config(real, models, gpus=gpu, watchdog={}, piecewise=True)  # shipped default windows
    d = _new_daemon(work, cfg, real)
    rec = Recorder(d).start()
    with _recording(res, d, rec):
        res["b_start"] = _start(d, rec)
        rows = list(rec.rows)
        res["b_start"]["phases"] = _phases(rows)
        quiet = max((float(r["last_progress_s"]) for r in rows if r.get("last_progress_s") is not None), default=0.0)
        res["b_start"]["max_quiet_s"] = round(quiet, 1)
        res["b_start"]["startup_stall_s"] = 180.0
        res["b_start"]["margin_s"] = round(180.0 - quiet, 1)
    return res


def _wait_onset(work: Path, timeout: float = 300.0) -> float:
    onset_file = work / "fault.onset"
    end = time.time() + timeout
    while not onset_file.exists() and time.time() < end:
        time.sleep(0.2)
    return float(onset_file.read_text()) if onset_file.exists() else time.time()


def _tp2_daemon(work: Path, real: Path, models: Path, gpus: str, *, fault: bool) -> tuple[Daemon, Recorder]:
    """Tensor parallelism 2; with `fault`, the start-up deadlock armed in rank 1 only (one-shot)."""
    wd = dict(configs.FAST, startup_stall_s=30.0, cpu_only_stall_s=30.0)
    env = _fault_env(work, "1") if fault else None
    cfg = configs.config(real, models, gpus=gpus, watchdog=wd, tp=2, env_extra=env, inject=fault)
    d = _new_daemon(work, cfg, real)
    return d, Recorder(d).start()


def lane_tp2_deadlock(work: Path, real: Path, models: Path, gpus: str = "0,1") -> dict[str, Any]:
    """Issue 15: a start-up deadlock in rank 1 only; rank 0 waits for it in its first collective."""
    res: dict[str, Any] = {"lane": "tp2_deadlock", "gpus": gpus}
    d, rec = _tp2_daemon(work, real, models, gpus, fault=True)
    with _recording(res, d, rec):
        onset = _wait_onset(work)
        res["fault_fired"] = (work / "fault.onset").exists()
        res["startup_deadlock_rank1"] = incident_record(d, onset, ready_timeout=0)
    return res


def lane_tp2(work: Path, real: Path, models: Path, gpus: str = "0,1") -> dict[str, Any]:
    """Issue 15: start to ready (roles, per-GPU memory by rank), then rank 1 SIGSTOPped under load.

    The verdict, the bundle and the stop with its release check are what is measured; the relaunch
    is not waited for (another 90 s of start-up that lane `ready` already shows)."""
    res: dict[str, Any] = {"lane": "tp2", "gpus": gpus}
    d, rec = _tp2_daemon(work, real, models, gpus, fault=False)
    with _recording(res, d, rec):
        res["start"] = _start(d, rec)
        st = d.status()
        res["ready"] = {"rung": st.get("rung"), "processes": st.get("processes"), "gpu": st.get("gpu"),
                        "titles": titles(int(st["pid"])) if st.get("pid") else []}
        port = int(d.config["server"]["port"])
        load = Load(port)
        time.sleep(12)
        res["load_before"] = {"ok": load.ok, "failed": load.failed}
        onset = time.time()
        res["stop_victim"] = _signal_scheduler(d, signal.SIGSTOP, rank=-1)
        res["sigstop_rank1"] = incident_record(d, onset, ready_timeout=0)
        res["load"] = load.stop()
    return res


def _bundle_grep(d: Daemon, bundle_id: Any, needle: str) -> dict[str, int]:
    """How many times each file of a bundle names `needle` (the stacks that show the stuck function)."""
    if not bundle_id:
        return {}
    doc = d.bundle(str(bundle_id))
    hits: dict[str, int] = {}
    for name in doc.get("files", []):
        try:
            text = d.http.get(f"/diagnostics/{bundle_id}/{name}").text
        except Exception:
            continue
        if needle in text:
            hits[name] = text.count(needle)
    return hits


LANES = {
    "serve": lane_serve, "stall": lane_stall, "deadlock": lane_deadlock, "ladder": lane_ladder,
    "piecewise": lane_piecewise, "tp2": lane_tp2, "tp2_deadlock": lane_tp2_deadlock,
}
