"""Issue 24's lanes on real SGLang: the Xid chain, and NCCL's RAS report of a two-rank hang.

- lane `xid`: a real illegal memory access inside the server (bench/real/inject/illegal_access.py:
  a Triton kernel reading address 0 from `ModelRunner.forward`, one-shot, after ready). Expected:
  the daemon journals the Xid (13 or 31), the rank dies, the incident's detail names the Xid, the
  server is relaunched and ready. With REAL_SIMULATE=1 (no GPU) the recipe stands in for the driver:
  the daemon's NVML is the fake one (a file), the lane writes the Xid there and SIGKILLs a scheduler.
- lane `tp2_ras`: lane `tp2` (rank 1 SIGSTOPped under load across two GPUs), with NCCL's RAS
  report, the collective's source and the ranks' sampling spread lifted from the bundle.
- The SIGSTOPped scheduler's bundle before/after pystack is lane `stall` (scenarios.py): its
  result carries the bundle's `durations`, `tools` (pystack, cuda-gdb) and `sampling`.
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


def _simulated() -> bool:
    return os.environ.get("REAL_SIMULATE") == "1"


def _fake_nvml(work: Path, xids: list[int]) -> Path:
    path = work / "nvml.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": [{"uuid": "GPU-sim-0"}], "xid_events": [{"gpu": 0, "xid": x} for x in xids]}))
    os.replace(tmp, path)
    return path


def _digest(bundle: dict[str, Any]) -> dict[str, Any]:
    """What issue 24 asks of a bundle: timings, tools, RAS, the collective's source, the spread, Xids."""
    s = bundle.get("summary") if isinstance(bundle.get("summary"), dict) else bundle
    return {k: s.get(k) for k in ("hang_class", "durations", "tools", "ras", "collective", "sampling", "gpu_xids")}


def lane_xid(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    from bench.real.scenarios import _recording, incident_record

    res: dict[str, Any] = {"lane": "xid", "gpu": gpu, "simulated": _simulated()}
    trigger, onset_file = work / "xid.trigger", work / "fault.onset"
    extra = {"REAL_FAULT": "illegal_access", "REAL_FAULT_TRIGGER": str(trigger),
             "REAL_FAULT_ONCE": str(work / "xid.once"), "REAL_FAULT_ONSET": str(onset_file)}
    cfg = configs.config(real, models, gpus=gpu, watchdog=dict(configs.FAST), env_extra=extra, inject=True)
    cfg["server"]["port"] = free_port()
    env = configs.daemon_env(real)
    if _simulated():  # the simulator's GPU, named by the config: its file raises the Xid below
        cfg["gpu"] = {"source": "simulator", "file": str(_fake_nvml(work, []))}
    d = Daemon(work, cfg, env)
    rec = Recorder(d).start()
    with _recording(res, d, rec):
        d.wait_ready()
        load = Load(int(d.config["server"]["port"]))
        time.sleep(10)
        trigger.write_text("go")
        if _simulated():  # the driver's part: an Xid, and the rank's context dies with it
            onset = time.time()
            _fake_nvml(work, [31])
            time.sleep(1.0)
            from bench.real.lab import schedulers

            os.kill(schedulers(int(d.status()["pid"]))[0].pid, signal.SIGKILL)
        else:
            end = time.time() + 120
            while not onset_file.exists() and time.time() < end:
                time.sleep(0.2)
            onset = float(onset_file.read_text()) if onset_file.exists() else time.time()
            res["fault_fired"] = onset_file.exists()
        res["xid_chain"] = incident_record(d, onset)
        ev = res["xid_chain"].get("events", [])
        xids = [e for e in ev if e.get("event") == "gpu_xid"]
        res["xid_seen"] = [{k: e.get(k) for k in ("ts", "gpu", "xid", "action", "text")} for e in xids]
        res["xid_named_by_incident"] = "Xid" in str(res["xid_chain"].get("detail") or "")
        res["relaunched_ready"] = res["xid_chain"].get("time_to_ready_s") is not None
        if res["xid_chain"].get("bundle"):
            res["bundle_digest"] = _digest(res["xid_chain"]["bundle"])
        res["load"] = load.stop()
        # issue 36 (stage i36xid): the relaunch's timeline after the Xid, phase by phase, against the
        # first start's (the warm-up request's phase is `warmup`), its kernel cache and the outage
        keep = ("launch_timeline", "outage", "kernel_cache", "weights_residency")
        res["journal36"] = [e for e in d.events() if e.get("event") in keep]
        res["launch_timeline"] = d.status().get("launch_timeline")
    return res


def lane_tp2_ras(work: Path, real: Path, models: Path, gpus: str = "0,1") -> dict[str, Any]:
    from bench.real.scenarios import lane_tp2

    res = lane_tp2(work, real, models, gpus)
    res["lane"] = "tp2_ras"
    bundle = (res.get("sigstop_rank1") or {}).get("bundle") or {}
    res["bundle_digest"] = _digest(bundle)
    return res


LANES = {"xid": lane_xid, "tp2_ras": lane_tp2_ras}
