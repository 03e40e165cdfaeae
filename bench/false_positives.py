"""False positives: long loads that look like hangs to a timer, and a busy healthy server.

- `slow_load`: 8 shards, one every 1.5 stall windows; between shards no log line, only read bytes
  and RSS move. Ten windows or more of loading: restarts must be 0.
- `quiet_load`: ten stall windows of silence after `Load weight begin.` while the disk is read.
- a ready server (EAGLE3 flags, SGLang-like 1 s `/health`) under steady `/generate` load for ten
  serving windows, then idle for five with frozen gauges: incidents must be 0.
The three run at once, each under its own daemon (the concurrency only adds stress).
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench.common import (
    SPEC_ARGS,
    Daemon,
    Traffic,
    W,
    header,
    met,
    parse_ts,
    publish,
    save_result,
    sim_settings,
    workdir,
)
from bench.report import table

WINDOWS = 10
SHARDS = 8


@dataclass
class FpResult:
    case: str
    fault_free_s: float = 0.0  # how long the hard-looking condition lasted
    windows: float = 0.0
    incidents: int = 0
    restarts: int = 0
    not_ready_samples: int = 0
    samples: int = 0
    requests_ok: int = 0
    detail: str = ""
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.error and self.incidents == 0 and self.restarts == 0 and self.not_ready_samples == 0


def _counts(d: Daemon) -> tuple[int, int]:
    ev = d.events()
    incidents = sum(e.get("event") in ("incident", "spec_regression") for e in ev)
    restarts = sum(e.get("event") == "server_launched" for e in ev) - 1
    return incidents, max(0, restarts)


def slow_load(out: FpResult) -> None:
    shard_s = 1.5 * W.startup_stall_s
    wd = workdir("fp-slow_load")
    d = Daemon(sim_settings(wd, "slow_load", env={"SGLANG_SIM_SHARD_S": str(shard_s)}), wd)
    _load_case(d, out, expected_s=SHARDS * shard_s, detail=f"a shard every {shard_s:g} s, {SHARDS} shards")


def quiet_load(out: FpResult) -> None:
    quiet_s = WINDOWS * W.startup_stall_s
    wd = workdir("fp-quiet_load")
    d = Daemon(sim_settings(wd, "quiet_load", env={"SGLANG_SIM_QUIET_S": str(quiet_s)}), wd)
    _load_case(d, out, expected_s=quiet_s, detail=f"{quiet_s:g} s without a log line after `Load weight begin.`")


def _load_case(d: Daemon, out: FpResult, *, expected_s: float, detail: str) -> None:
    out.detail = detail
    try:
        with d:
            st = d.wait(lambda s: s["state"] != "starting" and s["state"] != "stopped", expected_s + 60, "ready")
            out.incidents, out.restarts = _counts(d)
            out.extra["state"] = st["state"]
            ev = d.events()
            launched = next(parse_ts(e["ts"]) for e in ev if e.get("event") == "server_launched")
            ready = next((parse_ts(e["ts"]) for e in ev if e.get("event") == "server_ready"), None)
            if ready is None:
                out.error = f"not ready: {st['state']} ({st.get('reason')})"
                return
            out.fault_free_s = round(ready - launched, 1)
            out.windows = round(out.fault_free_s / W.startup_stall_s, 1)
    except (TimeoutError, RuntimeError) as err:
        out.error = str(err)


def serving(out: FpResult) -> None:
    wd = workdir("fp-serving")
    s = sim_settings(wd, "ok", args=SPEC_ARGS, env={"SGLANG_SIM_HEALTH_LATENCY_S": "1.0"})
    busy_s = WINDOWS * W.serving_stall_s
    idle_s = 5 * W.serving_stall_s
    out.detail = f"{busy_s:g} s of 3 concurrent /generate clients, then {idle_s:g} s idle; /health takes 1 s"
    try:
        with Daemon(s, wd) as d:
            d.wait(lambda x: x["state"] == "ready", 60, "ready")
            with Traffic(s.server.port, concurrency=3, seconds=busy_s + 5) as traffic:
                _sample(d, out, busy_s)
            out.requests_ok = int(traffic.summary.get("ok", 0))
            busy_samples = out.samples
            _sample(d, out, idle_s)
            out.extra["idle_samples"] = out.samples - busy_samples
            out.incidents, out.restarts = _counts(d)
            out.fault_free_s = busy_s
            out.windows = WINDOWS
    except (TimeoutError, RuntimeError) as err:
        out.error = str(err)


def _sample(d: Daemon, out: FpResult, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        st = d.status()
        out.samples += 1
        if st is None or st["state"] != "ready":
            out.not_ready_samples += 1
            out.extra.setdefault("not_ready", []).append(None if st is None else (st["state"], st.get("reason")))
        time.sleep(0.5)


def render(results: list[FpResult]) -> str:
    rows = []
    for r in results:
        extra = f"{r.requests_ok} requests answered; " if r.case.startswith("serving") else ""
        rows.append(
            [
                r.case,
                r.detail,
                f"{r.fault_free_s:g} s = {r.windows:g} windows",
                r.restarts,
                r.incidents,
                f"{extra}{r.not_ready_samples}/{r.samples}" if r.samples else "-",
                met(r.ok) + (f" ({r.error[:80]})" if r.error else ""),
            ]
        )
    intro = (
        f"Windows: {W.describe()}. Load cases: time from launch to ready. Serving: `/status` sampled every "
        "0.5 s; any state but `ready` counts. Target: zero restarts and zero incidents."
    )
    tbl = table(["case", "what happens", "lasted", "restarts", "incidents", "not-ready samples", "target"], rows)
    return header("False positives: slow loads and a busy server", "false_positives", intro) + "\n" + tbl + "\n"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    results = [FpResult("slow_load"), FpResult("quiet_load"), FpResult("serving (ok, EAGLE3)")]
    jobs = [slow_load, quiet_load, serving]
    threads = [threading.Thread(target=job, args=(r,)) for job, r in zip(jobs, results, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        print(f"false positives {r.case}: {r.__dict__}", flush=True)
    save_result("false_positives", [r.__dict__ | {"ok": r.ok} for r in results])
    publish("false_positives", render(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
