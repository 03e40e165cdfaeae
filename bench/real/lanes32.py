"""Issue 32's lanes on real SGLang (do no harm), one H200:

- lane `stranger`: a separate process holding 2.5 GiB of the GPU before the daemon starts (a
  notebook, a profiler): the launch must go ahead and the stranger be named in the journal. Then the
  server is stopped, a stranger that leaves too little for the rung (`mem-fraction-static` x the GPU)
  is started, and `POST /start` must be refused with the numbers; once that stranger exits, the
  launch goes ahead and the server is ready again.
- lane `cpuhog`: real SGLang started while `3 x cores` CPU-bound processes, each in its own session
  (so the server's session gets the smallest share under autogroup), run for 150 s, with the
  start-up window at 30 s: no `startup_stall`, the server ends ready on its base rung.

Every figure comes from the daemon's journal and API (`/events`, `/status`), as an operator sees it.
With REAL_SIMULATE=1 the simulator and its simulated GPU stand in (the stranger is a line in the GPU
file), to check the recipe on a CPU machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.real import configs
from bench.real.lab import Daemon, Recorder, free_port, iso

HOG = "import time\nwhile True:\n    sum(range(100000))\n"
# A CUDA context plus `gib` of plain device memory, held until killed.
HOLDER = (
    "import sys, time, torch\n"
    "x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device='cuda')\n"
    "torch.cuda.synchronize()\n"
    "print('held', flush=True)\n"
    "time.sleep(3600)\n"
)


def _simulated() -> bool:
    return os.environ.get("REAL_SIMULATE") == "1"


def _gpu_mib() -> dict[str, int]:
    """total/used MiB of GPU 0 from nvidia-smi (what the driver says, independent of the daemon)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=30).stdout.strip()
        total, used = (int(v) for v in out.split(","))
        return {"total_mib": total, "used_mib": used}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def _holder(gib: float, gpu: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(gib)], env=env, stdout=open(log, "wb"),  # noqa: SIM115
                         stderr=subprocess.STDOUT, start_new_session=True)
    end = time.time() + 120
    while time.time() < end and p.poll() is None and b"held" not in log.read_bytes():
        time.sleep(0.5)
    return p


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)


def _named(events: list[dict[str, Any]], name: str, since: float) -> list[dict[str, Any]]:
    since_iso = iso(since)
    return [e for e in events if e.get("event") == name and str(e.get("ts", "")) >= since_iso]


def lane_stranger(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    res: dict[str, Any] = {"lane": "stranger", "gpu": gpu, "simulated": _simulated(), "gpu_before": _gpu_mib()}
    cfg = configs.config(real, models, gpus=gpu, watchdog=dict(configs.FAST), fallbacks=False)
    cfg["server"]["port"] = free_port()
    small = _holder(2.5, gpu, work / "small.log") if not _simulated() else None
    res["gpu_with_small_stranger"] = _gpu_mib()
    t0 = time.time()
    d = Daemon(work, cfg, configs.daemon_env(real))
    rec = Recorder(d).start()
    big = None
    try:
        st = d.wait_ready(420.0)
        res["small"] = {"ready_s": round(time.time() - t0, 1), "rung": st.get("rung"),
                        "launch_refused": len(_named(d.events(), "launch_refused", t0)),
                        "clean_slate": _named(d.events(), "clean_slate", t0)[-1:]}
        d.post("/stop", timeout=120.0)
        d.wait(lambda s: s.get("state") == "stopped", 120.0)
        free_gib = (res["gpu_with_small_stranger"].get("total_mib", 0) - res["gpu_with_small_stranger"].get(
            "used_mib", 0)) / 1024
        big_gib = max(1.0, free_gib - 20.0)  # leaves ~20 GiB: less than 0.25 x 141 GiB
        res["big_stranger_gib"] = round(big_gib, 1)
        big = _holder(big_gib, gpu, work / "big.log") if not _simulated() else None
        res["gpu_with_big_stranger"] = _gpu_mib()
        t1 = time.time()
        d.post("/start")
        end = time.time() + 60
        while time.time() < end and not _named(d.events(), "launch_refused", t1):
            time.sleep(0.5)
        refused = _named(d.events(), "launch_refused", t1)
        res["big"] = {"refused": len(refused), "first_refusal": refused[:1],
                      "refused_within_s": round(time.time() - t1, 1)}
        if big is not None:
            _stop(big)
        t2 = time.time()
        d.wait_ready(420.0)
        res["after_big_left"] = {"ready_s": round(time.time() - t2, 1),
                                 "refusals_total": len(_named(d.events(), "launch_refused", t1))}
    except Exception as err:
        res["error"] = repr(err)
    finally:
        res["timeline"] = rec.stop()
        res["close"] = d.close()
        for p in (small, big):
            if p is not None:
                _stop(p)
    return res


def _start_beside_hogs(work: Path, real: Path, models: Path, gpu: str, res: dict[str, Any], *,
                       n_hogs: int, hog_s: float, cpus: str | None = None) -> dict[str, Any]:
    """Real SGLang started on its base rung (start-up window 30 s) while `n_hogs` CPU-bound
    processes, each in its own session, run for `hog_s`; with `cpus`, the server and the hogs are
    pinned there (taskset execs: the server keeps its pid), the daemon is not. Then the hogs end and
    the start finishes. Into `res`: when it was ready, on which rung, its incidents, the longest
    quiet time /status showed and the window extensions it stated."""
    watchdog = {**configs.FAST, "startup_stall_s": 30.0}
    cfg = configs.config(real, models, gpus=gpu, watchdog=watchdog)
    cfg["server"]["port"] = free_port()
    pin = ["taskset", "-c", cpus] if cpus else []
    cfg["server"]["command"] = [*pin, *cfg["server"]["command"]]
    hogs = [subprocess.Popen([*pin, sys.executable, "-c", HOG], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n_hogs)]
    t0 = time.time()
    d = Daemon(work, cfg, configs.daemon_env(real))
    rec = Recorder(d).start()
    try:
        while time.time() < t0 + hog_s:
            st = d.status()
            if st.get("state") == "ready" and "ready_under_hogs_s" not in res:
                res["ready_under_hogs_s"] = round(time.time() - t0, 1)
            time.sleep(1.0)
        for h in hogs:
            h.kill()
        st = d.wait_ready(420.0)
        ev = d.events()
        res["ready_s"] = res.get("ready_under_hogs_s") or round(time.time() - t0, 1)
        res["rung"] = st.get("rung")
        res["incidents"] = [{k: e.get(k) for k in ("ts", "cause", "hang_class", "detail", "reason")}
                            for e in _named(ev, "incident", t0)]
        res["startup_stalls"] = sum(1 for e in res["incidents"] if e.get("cause") == "startup_stall")
    except Exception as err:
        res["error"] = repr(err)
    finally:
        for h in hogs:
            if h.poll() is None:
                h.kill()
        rows = rec.stop()
        res["timeline"] = rows
        quiet = [float(r["last_progress_s"]) for r in rows if isinstance(r.get("last_progress_s"), (int, float))]
        res["longest_quiet_s"] = max(quiet, default=None)
        res["window_extended"] = sorted({str(r["reason"]) for r in rows if "extended" in str(r.get("reason"))})[:8]
        res["close"] = d.close()
    return res


def lane_cpuhog(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    """`3 x cores` hogs on the whole host for 150 s: the server's session gets the smallest share."""
    cores = os.cpu_count() or 1
    res: dict[str, Any] = {"lane": "cpuhog", "gpu": gpu, "simulated": _simulated(), "cores": cores,
                           "hogs": 3 * cores, "hog_s": 150}
    return _start_beside_hogs(work, real, models, gpu, res, n_hogs=3 * cores, hog_s=150.0)


def lane_cpupin(work: Path, real: Path, models: Path, gpu: str, *, cpus: str = "0,1", n_hogs: int = 8,
                hog_s: float = 150.0) -> dict[str, Any]:
    """Real starvation: the server pinned to `cpus`, shared with `n_hogs` hogs for `hog_s` (lane
    cpupin: 2 CPUs, 8 hogs, about 2/9 of a core for the tree; lane cpupin1: 1 CPU, 32 hogs, about
    1/33). Nothing else of the host is touched."""
    res: dict[str, Any] = {"lane": "cpupin", "gpu": gpu, "simulated": _simulated(), "cpus": cpus,
                           "hogs": n_hogs, "hog_s": hog_s}
    return _start_beside_hogs(work, real, models, gpu, res, n_hogs=n_hogs, hog_s=hog_s, cpus=cpus)


def lane_cpupin1(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    return {**lane_cpupin(work, real, models, gpu, cpus="0", n_hogs=32, hog_s=120.0), "lane": "cpupin1"}


LANES = {"stranger": lane_stranger, "cpuhog": lane_cpuhog, "cpupin": lane_cpupin, "cpupin1": lane_cpupin1}
