"""Issue 51's lane on one GPU (stage `i51` of device.sh, about 5 minutes with a warm start):

- lane `frontstop`: real SGLang (EAGLE-3 base rung) serving four clients; the server's main process
  (the HTTP front end and tokenizer manager) is SIGSTOPped. Judged `unhealthy` at the poll that sees
  the first failed health check (the verdict's `health_failures` figure 1, not `health_failures` 3),
  and line 1 of the bundle's summary.txt names the stopped front end. On the H100 before issue 51 the
  verdict waited for three failed checks (18.3 s) and line 1 named the scheduler's idle loop.

- lane `overhead`: real SGLang (base rung, no fault) serving four clients under a daemon with the
  shipped intervals (poll 2 s, health 10 s, metrics 5 s): the daemon's and its log keeper's CPU (% of
  one core) and RSS over OVERHEAD_S (90 s), then a `py-spy record` of the daemon (40 s) with its top
  functions. Target (issue 51): under 1 % of a core and 80 MB; before issue 51, 1.85 % and 95.8 MB.

With REAL_SIMULATE=1 they run on the simulator.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from bench.real import configs
from bench.real.lab import Daemon, Load, Recorder, free_port, own_cost, profile
from bench.real.scenarios import _recording, _start, incident_record

SIMULATE = os.environ.get("REAL_SIMULATE") == "1"
# The FAST windows; health probed every 2 s with a 30 s client timeout (longer than SGLang's own 20 s).
WATCH = dict(configs.FAST)
OVERHEAD_S = float(os.environ.get("REAL_I51_OVERHEAD_S", "90"))
PROFILE_S = int(os.environ.get("REAL_I51_PROFILE_S", "40"))


def lane_frontstop(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"lane": "frontstop", "gpu": gpu, "simulated": SIMULATE, "watchdog": WATCH}
    env = {"SGLANG_SIM_SCENARIO": "ok"} if SIMULATE else None
    cfg = configs.config(real, models, gpus=gpu, watchdog=dict(WATCH), env_extra=env)
    cfg["server"]["port"] = free_port()
    d = Daemon(work, cfg, configs.daemon_env(real))
    rec = Recorder(d).start()
    with _recording(res, d, rec):
        res["start"] = _start(d, rec)
        load = Load(int(d.config["server"]["port"]))
        time.sleep(10)
        st = d.status()
        main = int(st["pid"])
        res["load_before"] = {"ok": load.ok, "failed": load.failed}
        onset = time.time()
        os.kill(main, signal.SIGSTOP)
        res["victim"] = {"pid": main, "role": "main"}
        hang = incident_record(d, onset, ready_timeout=0)
        bundle = hang.get("bundle") or {}
        text = bundle.get("summary_txt") or ""
        verdict_file = work / "state" / "diagnostics" / str(hang.get("bundle_id")) / "verdict.json"
        verdict_doc = json.loads(verdict_file.read_text()) if verdict_file.exists() else None
        res["frontstop"] = {
            "detect_s": hang.get("detect_s"),
            "cause": hang.get("cause"),
            "hang_class": hang.get("hang_class"),
            "detail": hang.get("detail"),
            "bundle_s": hang.get("bundle_s"),
            "stop_s": hang.get("stop_s"),
            "first_line": text.splitlines()[0] if text else "",
            "first_line_names_front_end": text.startswith(f"Culprit: front end (main) pid {main} "),
            "head": text.splitlines()[:8],
            "verdict": verdict_doc,
            "health_events": [
                e for e in (hang.get("events") or []) if e.get("event") in ("incident", "state_changed")
            ][:6],
        }
        res["load_after"] = load.stop()
    return res


def lane_overhead(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"lane": "overhead", "gpu": gpu, "simulated": SIMULATE,
                           "intervals": "shipped (poll 2 s, health 10 s, metrics 5 s)"}
    env = {"SGLANG_SIM_SCENARIO": "ok"} if SIMULATE else None
    cfg = configs.config(real, models, gpus=gpu, watchdog={}, env_extra=env, fallbacks=False)
    cfg["server"]["port"] = free_port()
    d = Daemon(work, cfg, configs.daemon_env(real))
    rec = Recorder(d).start()
    with _recording(res, d, rec):
        res["start"] = _start(d, rec)
        rec.stop()  # its /status reads would be counted as the daemon's own cost
        load = Load(int(d.config["server"]["port"]))
        time.sleep(10)
        res["cost"] = own_cost(d.proc.pid, OVERHEAD_S)
        res["profile"] = profile(d.proc.pid, PROFILE_S, work / "daemon-profile", str(real / "bin" / "py-spy"))
        st = d.status()
        res["state"], res["incidents"] = st.get("state"), st.get("incidents")
        res["load"] = load.stop()
    return res


LANES = {"frontstop": lane_frontstop, "overhead": lane_overhead}
