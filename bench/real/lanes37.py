"""Issue 37's lane on real vLLM 0.26.0 (one H200, about 9 minutes): the daemon supervising
`python3 -m vllm.entrypoints.openai.api_server` (`[server] engine = "vllm"`), a tiny random Llama with a
random EAGLE-3 draft (bench/real/models.py), torch.compile and CUDA graphs on (vLLM's defaults).

- a: a start-up deadlock after the weights load (inject/vllmhang.py: a lock the thread already holds in
  vLLM's `Worker.determine_available_memory`, one-shot): `startup_stall` at the 30 s window, the bundle
  (its culprit first line), the relaunch on the same rung, ready; the launch timeline of each start.
- b: the random draft under 4 clients: `spec_regression` (`on_spec_regression = "fallback"`), the rung
  `no-speculation`, ready.
- c: `VLLM::EngineCore` SIGSTOPped under load: vLLM's `/health` reads a flag and stays 200, so the
  token counters must judge (`serving_stall`); the relaunch.
- d: `VLLM::EngineCore` SIGKILLed under load: the API server's own death path (`EngineDeadError`), the
  incident, the relaunch.
Every launch's server log stays in the state directory's logs/ (packed; the transcripts kept as CPU fixtures).

vLLM runs from its own site directory (`VLLM_SITE`, default /tmp/vllm/site: `bench/real/vllm_device.sh`
unpacks it); the daemon from the SGLang bundle's (`--real`, for fastapi/structlog/py-spy). With
REAL_SIMULATE=1 the lane runs on the simulator's vLLM (a CPU machine; b is skipped).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench.real import configs
from bench.real.lab import ROOT, SAFE_ENV, Daemon, Load, Recorder, free_port, title
from bench.real.lanes36 import _onset
from bench.real.scenarios import _recording, incident_record

SIMULATE = os.environ.get("REAL_SIMULATE") == "1"
KEEP = ("launch_timeline", "outage", "kernel_cache", "server_launched", "server_ready", "incident",
        "ladder_decision", "bundle_written", "server_stopped")
WATCH = dict(configs.FAST, startup_stall_s=30.0, on_spec_regression="fallback", spec_window_s=30.0)


def _site() -> Path:
    return Path(os.environ.get("VLLM_SITE", "/tmp/vllm/site"))


def _server_env(real: Path, gpu: str, extra: dict[str, str]) -> dict[str, str]:
    inject = str(ROOT / "bench" / "real" / "inject")
    path = [inject, str(ROOT)] if SIMULATE else [inject, str(_site())]
    sim = {"SGLANG_SIM_PACE": "0.2"} if SIMULATE else {}
    return {"PYTHONPATH": ":".join(path), **sim, "CUDA_VISIBLE_DEVICES": gpu, "HF_HUB_OFFLINE": "1",
            "PATH": f"{real / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}", **SAFE_ENV, **extra}


def _fault_env(work: Path) -> dict[str, str]:
    onset = str(work / "fault.onset")
    if SIMULATE:
        return {"SGLANG_SIM_SCENARIO": "deadlock_after_load", "SGLANG_SIM_FAULT_ONCE": "1",
                "SGLANG_SIM_ONSET_FILE": onset}
    return {"REAL_FAULT": "vllm_kv_deadlock", "REAL_FAULT_ONCE": str(work / "fault.once"), "REAL_FAULT_ONSET": onset}


def config(real: Path, models: Path, gpu: str, work: Path) -> dict[str, Any]:
    spec = {"method": "eagle3", "model": str(models / "draft"), "num_speculative_tokens": 3}
    command = [sys.executable, "-m", "supervisor.simulator", "--engine", "vllm"] if SIMULATE else \
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    diagnostics: dict[str, Any] = {"py_spy": True, "native": True, "gdb": "on_hang",
                                   "py_spy_path": str(real / "bin" / "py-spy")}
    if configs.cuda_gdb():
        diagnostics["gdb_path"] = configs.cuda_gdb()
    return {
        "server": {
            "engine": "vllm",
            "command": command,
            "host": "127.0.0.1",
            "port": free_port(),
            "env": _server_env(real, gpu, _fault_env(work)),
            "args": {
                "model": str(models / "target"),
                "skip-tokenizer-init": True,
                "gpu-memory-utilization": 0.2,
                "max-model-len": 2048,
                "max-num-seqs": 8,
                "speculative-config": json.dumps(spec),
            },
        },
        "fallback": [{"name": "no-speculation", "drop": ["speculative-config"], "on": ["spec_regression"]}],
        "watchdog": dict(WATCH),
        "restart": {"retries_per_rung": 3, "backoff_initial_s": 1.0, "backoff_max_s": 10.0,
                    "max_restarts_per_hour": 30, "stop_grace_s": 5.0, "hung_stop_grace_s": 1.0,
                    "release_timeout_s": 30.0, "start_from": "preferred"},
        "diagnostics": diagnostics,
    }


def vllm_load(port: int, model: str) -> Load:
    """4 clients posting /v1/completions with a token-id prompt (no tokenizer), 64 tokens each."""
    body = {"model": model, "prompt": list(range(5, 69)), "max_tokens": 64, "temperature": 0, "ignore_eos": True}
    return Load(port, path="/v1/completions", body=body)


def engine_core(pid: int) -> psutil.Process | None:
    """The tree's live `VLLM::EngineCore` (at tensor-parallel size 1 it runs the model itself)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None
    for p in kids:
        try:
            if title(p).startswith("VLLM::EngineCore") and p.status() != psutil.STATUS_ZOMBIE:
                return p
        except psutil.Error:
            continue
    return None


def _signal_core(d: Daemon, sig: signal.Signals) -> dict[str, Any]:
    st = d.status()
    core = engine_core(int(st["pid"]))
    if core is None:
        raise RuntimeError(f"no VLLM::EngineCore under pid {st.get('pid')}")
    os.kill(core.pid, sig)
    return {"pid": core.pid, "title": title(core), "signal": sig.name}


def _slim(rec: dict[str, Any]) -> dict[str, Any]:
    rec.pop("events", None)
    bundle = rec.pop("bundle", None) or {}
    text = bundle.get("summary_txt") or ""
    rec["summary_head"] = text.splitlines()[:12]
    rec["culprit"] = (bundle.get("summary") or {}).get("culprit")
    return rec


def lane_vllm(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res: dict[str, Any] = {"lane": "vllm", "gpu": gpu, "simulated": SIMULATE,
                           "startup_stall_s": WATCH["startup_stall_s"]}
    cfg = config(real, models, gpu, work)
    d = Daemon(work, cfg, configs.daemon_env(real))
    res["check_config"] = (work / "check-config.txt").read_text()[-4000:]
    rec = Recorder(d).start()
    port, model = int(cfg["server"]["port"]), str(models / "target")

    def save() -> None:  # after each step: a lane cut short by the device's limits keeps what it measured
        (work / "result.json").write_text(json.dumps(res, indent=1, default=str))

    with _recording(res, d, rec):
        onset = _onset(work, 400.0)
        res["a_deadlock"] = _slim(incident_record(d, onset))
        save()
        st = d.status()
        res["a_timeline"], res["a_status"] = st.get("launch_timeline"), {
            k: st.get(k) for k in ("state", "rung", "engine", "ladder_engines", "processes", "gpu", "serving")}
        load = vllm_load(port, model)
        if SIMULATE:
            res["b_skipped"] = "the simulator's acceptance is a scenario of its own (tests/integration)"
        else:
            res["b_spec"] = _slim(incident_record(d, time.time(), incident_timeout=150.0))
            if res["b_spec"].get("error"):
                res["b_spec"]["serving"] = d.status().get("serving")
            save()
        time.sleep(10)
        res["c_victim"] = _signal_core(d, signal.SIGSTOP)
        res["c_stall"] = _slim(incident_record(d, time.time() - 0.1))
        save()
        time.sleep(10)
        res["d_victim"] = _signal_core(d, signal.SIGKILL)
        res["d_kill"] = _slim(incident_record(d, time.time() - 0.1))
        res["load"] = load.stop()
        st = d.status()
        res["final"] = {k: st.get(k) for k in ("state", "rung", "engine", "restarts", "last_outage", "launch_timeline")}
        res["journal"] = [e for e in d.events() if e.get("event") in KEEP]
    res["lane_s"] = round(time.time() - t0, 1)
    res.pop("timeline", None)
    return res


LANES = {"vllm": lane_vllm}
