"""Issue 22's lanes on real SGLang: a busy hang in the draft model's CUDA-graph capture, and the same
start without it, three times, with the GPM and py-spy rules' readings during the legitimate
capture and compile stretches (the margin between the two).

- lane `busyhang`: the base rung (EAGLE-3, piecewise prefill graph off as in REAL_SGLANG.md) with
  `REAL_FAULT=busy_capture` (bench/real/inject/busyhang.py): a never-ending kernel launched inside
  `EAGLEDraftCudaGraphRunner.capture_one_shape`, then `Event.synchronize`. Windows: `FAST` with
  `startup_stall_s = 30` (stated in the docs) and the shipped `cpu_only_stall_s` (900 s, what the
  rule used to wait for). Measured: onset to verdict (target: 30 s + 2 polls = 32 s), cause and
  class (`startup_stall`, `cuda_graph_capture`), the kernel and host frame the bundle names, the
  GPM/py-spy readings, and the `no-cuda-graph` rung ready.
- lane `clean3`: default flags (piecewise CUDA graph on, its silent first compilation), the same
  windows, three starts in a row: zero incidents, and the rules' readings while capturing.

With REAL_SIMULATE=1 both run against the simulator (`busy_capture_hang` / `ok`) with its fake GPU
(a fake NVML file shared by the daemon and the server), to check the recipe on a CPU machine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from bench.real import configs
from bench.real.lab import Daemon, Recorder, free_port
from bench.real.scenarios import _phases, _recording, _start, incident_record

BUSY_STALL_S = 30.0
WATCH = dict(configs.FAST, startup_stall_s=BUSY_STALL_S)  # cpu_only_stall_s: the shipped 900 s
SIMULATE = os.environ.get("REAL_SIMULATE") == "1"


def _fake_gpu(work: Path) -> dict[str, str]:
    """REAL_SIMULATE: one simulated H200 with GPM, shared by the daemon (`[gpu]`, reads) and the
    simulator (`SGLANG_SIM_GPU_FILE` in the server's environment, writes)."""
    if not SIMULATE:
        return {}
    path = work / "fake-nvml.json"
    path.write_text(json.dumps({"devices": [{"util": 0, "mem_used": 1 << 30, "gpm": {"sm_util": 0.0}}]}))
    return {"SGLANG_SIM_GPU_FILE": str(path)}


def _daemon(work: Path, real: Path, cfg: dict[str, Any], gpu_env: dict[str, str]) -> Daemon:
    cfg["server"]["port"] = free_port()
    if gpu_env:  # the daemon reads the simulated GPU because its config says so
        cfg["gpu"] = {"source": "simulator", "file": gpu_env["SGLANG_SIM_GPU_FILE"]}
    return Daemon(work, cfg, configs.daemon_env(real))


def _fault_env(work: Path) -> dict[str, str]:
    env = {
        "REAL_FAULT": "busy_capture",
        "REAL_FAULT_ONCE": str(work / "fault.once"),
        "REAL_FAULT_ONSET": str(work / "fault.onset"),
    }
    if SIMULATE:
        env.update(SGLANG_SIM_SCENARIO="busy_capture_hang", SGLANG_SIM_ONSET_FILE=str(work / "sim.onset"))
    return env


def _onset(work: Path, timeout: float = 400.0) -> float:
    end = time.time() + timeout
    while time.time() < end:
        if (work / "fault.onset").exists():
            return float((work / "fault.onset").read_text())
        if (work / "sim.onset").exists():
            wall = json.loads((work / "sim.onset").read_text()).get("onset_wall")
            if wall is not None:
                return float(wall)
        time.sleep(0.2)
    return time.time()


def readings(rows: list[dict[str, Any]], t0: float | None = None, t1: float | None = None) -> dict[str, Any]:
    """The two rules' inputs over rows in [t0, t1] (capturing_graphs only when no times are given)."""
    sel = [r for r in rows if (t0 is None or r["t"] >= t0) and (t1 is None or r["t"] <= t1)]
    if t0 is None and t1 is None:
        sel = [r for r in sel if r.get("phase") == "capturing_graphs"]
    sm = [g[2] for r in sel for g in r.get("gpm") or [] if g[2] is not None]
    busy_sm = [g[2] for r in sel for g in r.get("gpm") or [] if g[2] is not None and (g[1] or 0) >= 50]
    util = [g[1] for r in sel for g in r.get("gpm") or [] if g[1] is not None]
    kinds: dict[str, int] = {}
    spin = [float((r.get("busy") or {}).get("gpm_spin_s") or 0.0) for r in sel]
    looks = 0
    for r in sel:
        b = r.get("busy") or {}
        looks = max(looks, int(b.get("looks") or 0))
    last = sel[-1].get("busy") or {} if sel else {}
    for k in last.get("kinds") or []:
        kinds[k] = kinds.get(k, 0) + 1
    return {
        "rows": len(sel),
        "seconds": round(sel[-1]["t"] - sel[0]["t"], 1) if sel else 0.0,
        "gpm_status": sorted({str(r.get("gpm_status")) for r in sel}),
        "util_max": max(util, default=None),
        "sm_active_min": min(sm, default=None),
        "sm_active_max": max(sm, default=None),
        "sm_active_when_busy_max": max(busy_sm, default=None),  # SM while util >= 50 %: the spin test
        "gpm_spin_s_max": max(spin, default=0.0),
        "looks_max": looks,
        "last_kinds": kinds,
        "waits_in": last.get("waits_in"),
        "quiet_max_s": max(
            (float(r["last_progress_s"]) for r in sel if r.get("last_progress_s") is not None), default=None
        ),
    }


def lane_busyhang(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {
        "lane": "busyhang",
        "gpu": gpu,
        "startup_stall_s": BUSY_STALL_S,
        "poll_interval_s": WATCH["poll_interval_s"],
        "simulated": SIMULATE,
    }
    gpu_env = _fake_gpu(work)
    cfg = configs.config(
        real, models, gpus=gpu, watchdog=dict(WATCH), env_extra={**_fault_env(work), **gpu_env}, inject=True
    )
    d = _daemon(work, real, cfg, gpu_env)
    rec = Recorder(d).start()
    with _recording(res, d, rec):
        onset = _onset(work)
        hang = incident_record(d, onset, ready_timeout=420.0)
        res["hang"] = hang
        verdict = hang.get("verdict_at")
        rows = list(rec.rows)
        v_t = next((r["t"] for r in rows if r.get("state") in ("hung", "diagnosing", "restarting")), None)
        res["hang_readings"] = readings(rows, onset, v_t)
        res["verdict_ts"] = verdict
        summary = (hang.get("bundle") or {}).get("summary") or {}
        res["kernels"] = summary.get("gpu_kernels")
        res["bundle_gpm"] = (summary.get("nvml") or {}).get("gpm")
        res["target_s"] = BUSY_STALL_S + 2 * float(WATCH["poll_interval_s"])
        res["within_target"] = hang.get("detect_s") is not None and float(hang["detect_s"]) <= res["target_s"]
        res["selfcheck"] = d.status().get("selfcheck")
    return res


def lane_clean3(work: Path, real: Path, models: Path, gpu: str, runs: int = 3) -> dict[str, Any]:
    res: dict[str, Any] = {
        "lane": "clean3",
        "gpu": gpu,
        "startup_stall_s": BUSY_STALL_S,
        "runs": [],
        "simulated": SIMULATE,
    }
    for i in range(runs):
        run_dir = work / f"run{i + 1}"
        run_dir.mkdir(parents=True, exist_ok=True)
        gpu_env = _fake_gpu(run_dir)
        cfg = configs.config(real, models, gpus=gpu, watchdog=dict(WATCH), piecewise=True, env_extra=gpu_env)
        d = _daemon(run_dir, real, cfg, gpu_env)
        rec = Recorder(d).start()
        run: dict[str, Any] = {"run": i + 1}
        with _recording(run, d, rec):
            start = _start(d, rec)
            rows = list(rec.rows)
            run["ready_s"] = start.get("ready_s")
            run["incidents"] = start.get("incidents")
            run["rung"] = start.get("rung")
            run["phases"] = _phases(rows)
            run["capture_readings"] = readings(rows)
            run["start_readings"] = readings(rows, rows[0]["t"] if rows else None, None)
        run["incidents_total"] = sum(1 for e in run.get("close", {}).get("events", []) if e.get("event") == "incident")
        run.pop("timeline", None)
        run["close"] = {"daemon_exit": run.get("close", {}).get("daemon_exit")}
        res["runs"].append(run)
    res["incidents"] = sum(int(r.get("incidents_total") or 0) for r in res["runs"])
    return res


LANES = {"busyhang": lane_busyhang, "clean3": lane_clean3}
