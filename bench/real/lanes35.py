"""Issue 35's lanes on one H200 (stage `i35` of device.sh, about 9 minutes with setup):

- lane `power35`: one GPU's power at idle, under a spinning kernel (`torch.cuda._sleep`) and under
  bf16 matmuls (bench/real/powerprobe.py): the figures the power rule (policy/gpupower.py) rests on.
- lane `frpipe`: the Flight Recorder's pipe mechanics with a real one-rank NCCL group
  (bench/real/frprobe.py launched with flightrec.launch_env's variables): the daemon's own
  `flight_record` writes the pipe, waits for the dump, reads it with the rank's Python and judges it.
- lane `gilhang`: real SGLang (EAGLE-3 base rung) with two one-shot faults: nvidia-resiliency-ext's
  LOCK_GIL after the weights load (bench/real/inject/lockgil.py: libc sleep through ctypes.PyDLL in
  `ModelRunner.init_attention_backends`), then, on the relaunch, the never-ending kernel in the draft
  graph's capture (inject/busyhang.py). Each bundle's first line must name the culprit thread and
  frame (`init_attention_backend`, `synchronize`), summary.json must carry `culprit`, and the bundle
  should take under 5 s.
- lane `i35`: the three in turn (power first: alone on the GPU), one result.json.

With REAL_SIMULATE=1 `gilhang` runs on the simulator (`lock_gil_after_load`); `power35` and
`frpipe` need torch with CUDA and say so.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.real import configs
from bench.real.lab import ROOT, SAFE_ENV, Daemon, Recorder, free_port
from bench.real.scenarios import _recording, incident_record
from supervisor.diagnostics.flightrec import flight_record, launch_env

SIMULATE = os.environ.get("REAL_SIMULATE") == "1"
WATCH = dict(configs.FAST, startup_stall_s=30.0)


def _child_env(gpu: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, **SAFE_ENV, **(extra or {})}


def lane_power35(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"lane": "power35", "gpu": gpu}
    if SIMULATE:
        return {**res, "skipped": "needs a GPU (REAL_SIMULATE)"}
    out = work / "power.json"
    try:
        r = subprocess.run([sys.executable, "-m", "bench.real.powerprobe", str(out), "10"], cwd=ROOT,
                           env=_child_env(gpu), capture_output=True, text=True, timeout=120)
        res["exit"] = r.returncode
        res["stderr_tail"] = r.stderr[-2000:]
        if out.exists():
            res["summary"] = json.loads(out.read_text())["summary"]
    except subprocess.TimeoutExpired:
        res["error"] = "powerprobe took over 120 s"
    return res


def lane_frpipe(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"lane": "frpipe", "gpu": gpu}
    if SIMULATE:
        return {**res, "skipped": "needs torch with CUDA (REAL_SIMULATE)"}
    env = {**_child_env(gpu), **launch_env({}, work / "fr", 2000)}
    res["env"] = {k: v for k, v in env.items() if k.startswith("TORCH_")}
    log = open(work / "frprobe.log", "w")  # noqa: SIM115 - the child holds it
    child = subprocess.Popen([sys.executable, "-u", "-m", "bench.real.frprobe", "7"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    try:
        t0 = time.time()
        line = child.stdout.readline() if child.stdout else ""
        res["ready_s"] = round(time.time() - t0, 1)
        res["ready_line"] = line.strip()
        if not line.startswith("ready"):
            res["error"] = "the rank never said ready (frprobe.log)"
            return res
        time.sleep(2.0)  # its heartbeat monitor has opened the pipe
        res["pipes_before"] = sorted(os.listdir(work / "fr"))
        tic = time.time()
        report = asyncio.run(flight_record(env, [child.pid], [sys.executable], 15.0))
        res["flight_record_s"] = round(time.time() - tic, 2)
        res["report"] = report.doc()
        res["dump_bytes"] = {r: os.path.getsize(p) for r, p in report.dumps.items() if os.path.exists(p)}
        res["entries"] = [len(d.entries) for d in report.read]
        res["analyzer_head"] = report.analyzer[:3000]
        res["ok"] = report.status == "ok" and bool(report.dumps)
    finally:
        child.kill()
        child.wait()
        log.close()
    return res


def _first_line(bundle: dict[str, Any]) -> str:
    text = bundle.get("summary_txt") or ""
    return text.splitlines()[0] if text else ""


def _culprit_check(hang: dict[str, Any], want: tuple[str, ...]) -> dict[str, Any]:
    bundle = hang.get("bundle") or {}
    first = _first_line(bundle)
    summary = bundle.get("summary") or {}
    return {
        "first_line": first,
        "culprit": summary.get("culprit"),
        "first_line_names_culprit": first.startswith("Culprit: ") and "thread '" in first
        and any(w in first for w in want),
        "bundle_s": hang.get("bundle_s"),
        "bundle_under_5s": hang.get("bundle_s") is not None and float(hang["bundle_s"]) < 5.0,
        "cause": hang.get("cause"),
        "hang_class": hang.get("hang_class"),
        "detect_s": hang.get("detect_s"),
        "flight_recorder": summary.get("flight_recorder"),
        "head": (bundle.get("summary_txt") or "").splitlines()[:8],
    }


def _onset(path: Path, timeout: float) -> float | None:
    end = time.time() + timeout
    while time.time() < end:
        if path.exists():
            try:
                raw = path.read_text()
                return float(json.loads(raw)["onset_wall"]) if raw.startswith("{") else float(raw)
            except (ValueError, KeyError, OSError):
                pass
        time.sleep(0.2)
    return None


def lane_gilhang(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"lane": "gilhang", "gpu": gpu, "simulated": SIMULATE}
    res["startup_stall_s"] = WATCH["startup_stall_s"]
    gil_onset, spin_onset = work / "gil.onset", work / "spin.onset"
    env = {
        "REAL_FAULT_GIL": "1", "REAL_FAULT_GIL_ONCE": str(work / "gil.once"), "REAL_FAULT_GIL_ONSET": str(gil_onset),
        "REAL_FAULT": "busy_capture", "REAL_FAULT_ONCE": str(work / "spin.once"), "REAL_FAULT_ONSET": str(spin_onset),
    }
    if SIMULATE:
        env = {"SGLANG_SIM_SCENARIO": "lock_gil_after_load", "SGLANG_SIM_ONSET_FILE": str(gil_onset)}
    cfg = configs.config(real, models, gpus=gpu, watchdog=dict(WATCH), env_extra=env, inject=True)
    cfg["server"]["port"] = free_port()
    d = Daemon(work, cfg, configs.daemon_env(real))
    rec = Recorder(d).start()
    with _recording(res, d, rec):
        onset = _onset(gil_onset, 400.0)
        res["gil_onset_found"] = onset is not None
        hang = incident_record(d, onset or time.time(), ready_timeout=0)
        res["gil"] = _culprit_check(hang, ("init_attention_backend",))
        res["gil"]["events"] = len(hang.get("events") or [])
        if not SIMULATE:
            onset2 = _onset(spin_onset, 300.0)
            res["spin_onset_found"] = onset2 is not None
            if onset2 is not None:
                hang2 = incident_record(d, onset2, ready_timeout=200.0)
                res["spin"] = _culprit_check(hang2, ("synchronize", "capture_one_shape"))
                res["spin"]["ready_rung"] = hang2.get("ready_rung")
        res["selfcheck"] = d.status().get("selfcheck")
    res.pop("timeline", None)
    return res


def lane_i35(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    out: dict[str, Any] = {"lane": "i35", "gpu": gpu}
    for name, fn in (("power35", lane_power35), ("frpipe", lane_frpipe), ("gilhang", lane_gilhang)):
        t0 = time.time()
        try:
            out[name] = fn(work / name, real, models, gpu)
        except Exception as err:  # one lane failing keeps the others' figures
            out[name] = {"error": repr(err)}
        out[name]["seconds"] = round(time.time() - t0, 1)
        (work / "result.json").write_text(json.dumps(out, indent=1, default=str))  # after each: a kill keeps it
    return out


LANES = {"power35": lane_power35, "frpipe": lane_frpipe, "gilhang": lane_gilhang, "i35": lane_i35}
