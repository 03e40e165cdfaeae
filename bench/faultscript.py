"""The fault script (issue 49): a scripted day of faults on the simulator, one daemon, an operator's
five-rung ladder, and per fault the outage the clients saw against the ideal an oracle could have had.

Run: `.venv/bin/python -m bench.outage --script day [--daemon-python PATH] [--label old|new]
[--ladder plain|on]`.
`--daemon-python` is the interpreter the daemon (and, through bench/faultserver.py, the simulator)
runs under: another checkout's venv measures that checkout's daemon; the bench itself only drives
it through its HTTP API, its journal (`events.jsonl`) and signals.

**Time.** Every production duration is scaled by one factor, SCALE = 0.01: a 25-minute load
(8 shards) takes 15 s, SGLang's import 0.33 s, the first prefill compile 0.9 s, and the windows
follow (`startup_stall_s` 180 s, `spec_window_s` 120 s, health every 10 s with a 30 s timeout and
3 failures, `stop_grace_s` 30 s, backoff from 1 s to 300 s, `stable_s` 600 s, faults 5 minutes
apart). A scaled window shorter than a 2-core machine can honour is floored (FLOORS: the poll stays
0.5 s, a start-up stall window 3 s, a health probe 0.5 s every 1 s, the speculative window 3 s),
`stable_s` 12 s (the floors stretch a verdict to up to 5 s; in production a fault 5 minutes after a
recovery is judged before the 10 minutes of `stable_s` end, and so it is here); the hourly restart
budget cannot be scaled (its hour is fixed), so it is 100.

**The ladder** (`retries_per_rung` 1 as shipped, start from the last good rung as shipped,
speculative regressions fall back): `base` (EAGLE3 speculation, CUDA graphs), `smaller-graphs`
(`cuda-graph-max-bs 8`), `no-cuda-graph` (`disable-cuda-graph`), `no-spec` (`disable-cuda-graph`,
speculation dropped), `safe` (as `no-spec`, `mem-fraction-static 0.8`). `--ladder plain`: no `on`
triggers; `--ladder on`: `no-cuda-graph` on `cuda_graph_capture` and `no-spec` on `spec_regression`,
as an operator who knows these faults writes it (bench/real/configs.py's ladder has both).

**The faults**, injected by the bench through a control file its server wrapper reads at each
launch (bench/faultserver.py), in the order run (issue 49 lists the daemon restart last; it runs
in the middle, while serving on a fallback rung, so it is row 6 here):
 1. transient deadlock: the first launch deadlocks after load (`deadlock_after_load`, once); onset:
    the simulator's. Ideal: detection at `startup_stall_s` + stop + 1 relaunch of the same rung.
 2. configuration fault: from now on every launch of a rung without `--disable-cuda-graph` hangs in
    graph capture (`busy_capture_hang`); an operator's restart (after a driver update) meets it;
    onset: the simulator's (the hang). Ideal: detection at `startup_stall_s` + stop + 1 launch
    straight to `no-cuda-graph`.
 3. speculative regression: launches with speculation accept poorly (`low_accept`, armed since step 2);
    onset: the bench starts 3 clients. Ideal: detection at `spec_window_s` + stop + 1 launch of the
    first rung without speculation below (`no-spec`).
 4. Xid: Xid 31 on GPU 0, then SIGKILL of scheduler rank 1 (as bench/outage.py's xid case); onset:
    the Xid. Ideal: a poll + stop + 1 relaunch of the same rung.
 5. stopped HTTP front end: SIGSTOP of the server's main process, left stopped (the daemon must
    judge it: health checks fail; its stop SIGKILLs it); onset: the SIGSTOP. Ideal: the health
    window (`health_failures` x max(interval, timeout)) + stop + 1 relaunch of the same rung (it
    served: a stopped process is no fault of its configuration).
 6. daemon restart: SIGKILL of the daemon while serving on a fallback rung, a new daemon on the same
    state directory at once. Ideal: adoption, 0 launches, 0 s.
 7. promote while step 2's cause persists: `POST /promote`; onset: the promote. Ideal: stop + the
    preferred rung's launch up to its capture hang + detection at `startup_stall_s` + stop + 1 launch
    straight back to the rung that served before the promote (2 launches, no backoff).
 8. promote after the fix (the control file no longer names the fault): `POST /promote`; onset: the
    promote. Ideal: stop + 1 launch of the preferred rung.
The oracle knows the fault, so it captures no evidence: the daemon's evidence is part of its excess.
Its stop and each launch take what this run's own stops and launches took (median `stop_s` +
`release_wait_s` of its `server_stopped` events; median `time_to_ready_s` of its launches on that
rung, or of all launches when the rung never served). Outage: onset to the journal's next
`server_ready`; launches: `server_launched` events from the onset to that ready. Ratio: outage over
ideal (an ideal of 0 s met within a poll counts 1.0). Targets (issue 49): the total within 1.2x the
ideal, every row within 2x.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    ROOT,
    SPEC_ARGS,
    Daemon,
    OnsetWatcher,
    Traffic,
    W,
    free_port,
    header,
    load_result,
    parse_ts,
    publish,
    read_events,
    save_result,
    workdir,
)
from bench.faultserver import CONTROL_ENV
from bench.outage import inject_xid, write_gpu_file
from bench.report import table
from supervisor.common.waiting import wait_for
from supervisor.config.render import dump_mapping
from supervisor.config.settings import settings_from_mapping
from supervisor.simulator import daemonconfig
from supervisor.simulator.daemonconfig import SimWindows

SCALE = 0.01  # every production duration times this
REAL = {  # production durations, seconds
    "load": 1500.0,  # the model's weights: 25 minutes
    "import": 33.0,  # SGLang's import (real 0.5.16)
    "prefill_compile": 90.0,  # the piecewise prefill graph's first compile (68-105 s)
    "startup_stall_s": 180.0,
    "cpu_only_stall_s": 900.0,
    "health_interval_s": 10.0,
    "health_timeout_s": 30.0,
    "serving_stall_s": 60.0,
    "metrics_interval_s": 5.0,
    "spec_window_s": 120.0,
    "stop_grace_s": 30.0,
    "hung_stop_grace_s": 1.0,
    "backoff_initial_s": 1.0,
    "backoff_max_s": 300.0,
    "stable_s": 600.0,
    "release_timeout_s": 60.0,
    "gap": 300.0,  # between one fault's recovery and the next fault
}
FLOORS = {  # what a loaded 2-core machine can honour
    "startup_stall_s": 3.0,
    "health_interval_s": 1.0,
    "health_timeout_s": 0.5,
    "serving_stall_s": 2.0,
    "metrics_interval_s": 0.5,
    "spec_window_s": 3.0,
    # The floors stretch a verdict up to 5 s; as in production (a fault 5 minutes after a recovery,
    # judged within 3, stable only after 10) the next fault's verdict must come before the rung is stable.
    "stable_s": 12.0,
}
POLL_S = W.poll_s
HEALTH_FAILURES = 3
SHARDS = 8  # the simulator's default checkpoint
STEP_TIMEOUT_S = 300.0
TOTAL_TARGET, ROW_TARGET = 1.2, 2.0
SPEC_DROP = tuple(SPEC_ARGS)
PLAIN: tuple[dict[str, Any], ...] = (
    {"name": "smaller-graphs", "args": {"cuda-graph-max-bs": 8}},
    {"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}},
    {"name": "no-spec", "args": {"disable-cuda-graph": True}, "drop": list(SPEC_DROP)},
    {"name": "safe", "args": {"disable-cuda-graph": True, "mem-fraction-static": 0.8}, "drop": list(SPEC_DROP)},
)
# The same rungs with the triggers an operator who knows the faults writes (bench/real/configs.py's
# ladder does): a graph-capture hang jumps to no-cuda-graph, a speculative regression to no-spec.
TRIGGERS = {"no-cuda-graph": ["cuda_graph_capture"], "no-spec": ["spec_regression"]}
LADDERS: dict[str, tuple[dict[str, Any], ...]] = {
    "plain": PLAIN,
    "on": tuple({**r, "on": TRIGGERS[r["name"]]} if r["name"] in TRIGGERS else r for r in PLAIN),
}
PREFERRED = "base"


def scaled(name: str) -> float:
    """A production duration times SCALE, at least its floor."""
    return round(max(REAL[name] * SCALE, FLOORS.get(name, 0.0)), 3)


def health_window_s() -> float:
    return HEALTH_FAILURES * max(scaled("health_interval_s"), scaled("health_timeout_s"))


# ---- the steps and their ideal ------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    name: str
    kind: str  # relaunch | adopt | promote_persists | promote_fixed
    detect: str  # the window the oracle waits for evidence: a REAL key, "poll", "health" or ""
    target: str  # the rung the oracle serves on after it: a name, "same" or "served" (before the step)


STEPS: tuple[Step, ...] = (
    Step("transient deadlock", "relaunch", "startup_stall_s", "same"),
    Step("graph-capture fault", "relaunch", "startup_stall_s", "no-cuda-graph"),
    Step("speculative regression", "relaunch", "spec_window_s", "no-spec"),
    Step("xid", "relaunch", "poll", "same"),
    Step("stopped front end", "relaunch", "health", "same"),
    Step("daemon restart", "adopt", "", "same"),
    Step("promote, cause persists", "promote_persists", "startup_stall_s", "served"),
    Step("promote, fixed", "promote_fixed", "", PREFERRED),
)


def detect_s(step: Step) -> float:
    if step.detect == "poll":
        return POLL_S
    if step.detect == "health":
        return health_window_s()
    return scaled(step.detect) if step.detect else 0.0


@dataclass(frozen=True)
class Pieces:
    """What the oracle's recovery is made of, measured in this run (the oracle decides, the machine
    still takes its time): a stop, a launch to ready on the target rung, and for a promote that
    meets the fault, the preferred rung's launch up to the fault."""

    stop_s: float
    launch_s: float
    to_fault_s: float = 0.0


def ideal(step: Step, p: Pieces) -> tuple[float, int]:
    """The oracle's outage (seconds) and launches for `step`."""
    if step.kind == "adopt":
        return 0.0, 0
    if step.kind == "promote_fixed":
        return p.stop_s + p.launch_s, 1
    if step.kind == "promote_persists":
        return p.stop_s + p.to_fault_s + detect_s(step) + p.stop_s + p.launch_s, 2
    return detect_s(step) + p.stop_s + p.launch_s, 1


def ratio(outage_s: float | None, ideal_s: float) -> float | None:
    """Outage over ideal; an ideal of 0 s met within a poll is 1.0, missed is infinite."""
    if outage_s is None:
        return None
    if ideal_s <= 0:
        return 1.0 if outage_s <= POLL_S else float("inf")
    return outage_s / ideal_s


@dataclass
class Row:
    step: int
    name: str
    onset: float | None = None  # wall
    outage_s: float | None = None
    ideal_s: float = 0.0
    launches: int | None = None
    ideal_launches: int = 0
    rung_before: str = ""
    rung_after: str = ""
    target: str = ""
    error: str = ""

    @property
    def ratio(self) -> float | None:
        return ratio(self.outage_s, self.ideal_s)


@dataclass(frozen=True)
class Totals:
    outage_s: float
    ideal_s: float
    launches: int
    ideal_launches: int
    ratio: float | None
    total_met: bool
    rows_met: bool


def totals(rows: Sequence[Row]) -> Totals:
    """The total line: sums over the rows that measured an outage; the targets over all rows."""
    done = [r for r in rows if r.outage_s is not None]
    out = sum(r.outage_s or 0.0 for r in done)
    ide = sum(r.ideal_s for r in done)
    tot = out / ide if ide > 0 else None
    rows_met = len(done) == len(rows) and all((r.ratio or 0.0) <= ROW_TARGET for r in done)
    return Totals(
        round(out, 3),
        round(ide, 3),
        sum(r.launches or 0 for r in done),
        sum(r.ideal_launches for r in done),
        None if tot is None else round(tot, 3),
        tot is not None and tot <= TOTAL_TARGET and len(done) == len(rows),
        rows_met,
    )


# ---- what the journal says ----------------------------------------------------------------------


def _after(ev: Sequence[dict[str, Any]], kind: str, t0: float) -> list[dict[str, Any]]:
    return [e for e in ev if e.get("event") == kind and parse_ts(str(e["ts"])) >= t0 - 0.002]


def ready_after(ev: Sequence[dict[str, Any]], t0: float) -> dict[str, Any] | None:
    """The first `server_ready` at or after t0 (wall)."""
    found = _after(ev, "server_ready", t0)
    return found[0] if found else None


def launches_between(ev: Sequence[dict[str, Any]], t0: float, t1: float) -> int:
    return sum(1 for e in _after(ev, "server_launched", t0) if parse_ts(str(e["ts"])) <= t1 + 0.002)


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def launch_times(ev: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median time to ready per rung over this run's launches (adoptions aside); "*": all of them."""
    by: dict[str, list[float]] = {}
    for e in ev:
        if e.get("event") == "server_ready" and not e.get("adopted") and e.get("time_to_ready_s") is not None:
            by.setdefault(str(e["rung"]), []).append(float(e["time_to_ready_s"]))
            by.setdefault("*", []).append(float(e["time_to_ready_s"]))
    return {k: float(statistics.median(v)) for k, v in by.items()}


def stop_time(ev: Sequence[dict[str, Any]]) -> float:
    xs = [
        float(e.get("stop_s") or 0.0) + float(e.get("release_wait_s") or 0.0)
        for e in ev
        if e.get("event") == "server_stopped"
    ]
    return _median(xs) or 0.0


def fill(rows: Sequence[Row], ev: Sequence[dict[str, Any]], to_fault_s: float | None) -> None:
    """Each row's outage, launches, rung after and ideal from the journal (rows already hold onsets)."""
    launch = launch_times(ev)
    stop = stop_time(ev)
    for row in rows:
        step = STEPS[row.step - 1]
        row.target = row.rung_before if step.target in ("same", "served") else step.target
        pieces = Pieces(stop, launch.get(row.target, launch.get("*", 0.0)), to_fault_s or launch.get("*", 0.0))
        ideal_s, row.ideal_launches = ideal(step, pieces)
        row.ideal_s = round(ideal_s, 3)
        if row.onset is None or step.kind == "adopt":
            continue
        ready = ready_after(ev, row.onset)
        if ready is None:
            row.error = row.error or "never served again"
            continue
        end = parse_ts(str(ready["ts"]))
        row.outage_s = round(end - row.onset, 3)
        row.launches = launches_between(ev, row.onset, end)
        row.rung_after = str(ready.get("rung", ""))


# ---- running it ---------------------------------------------------------------------------------


def windows() -> SimWindows:
    return SimWindows(
        poll_s=POLL_S,
        startup_stall_s=scaled("startup_stall_s"),
        startup_timeout_s=600.0,
        cpu_only_stall_s=scaled("cpu_only_stall_s"),
        health_interval_s=scaled("health_interval_s"),
        health_timeout_s=scaled("health_timeout_s"),
        health_failures=HEALTH_FAILURES,
        serving_stall_s=scaled("serving_stall_s"),
        metrics_interval_s=scaled("metrics_interval_s"),
        spec_window_s=scaled("spec_window_s"),
        backoff_initial_s=scaled("backoff_initial_s"),
        backoff_max_s=scaled("backoff_max_s"),
        stop_grace_s=scaled("stop_grace_s"),
        release_timeout_s=scaled("release_timeout_s"),
        max_restarts_per_hour=100,
        py_spy_timeout_s=W.py_spy_timeout_s,
        pace=W.pace,
        health_latency_s=W.health_latency_s,
        sglang_health_timeout_s=W.sglang_health_timeout_s,
        idle_metrics_s=W.idle_metrics_s,
    )


def config(wd: Path, python: str, control: Path, gpu_file: Path, ladder: str = "plain") -> dict[str, Any]:
    """The daemon's config mapping: only what differs from the shipped defaults is written, so an
    older daemon reads it too."""
    sim_env = {
        CONTROL_ENV: str(control),
        "SGLANG_SIM_SHARD_S": f"{REAL['load'] * SCALE / SHARDS:g}",
        "SGLANG_SIM_IMPORT_S": f"{REAL['import'] * SCALE:g}",
        "SGLANG_SIM_PREFILL_COMPILE_S": f"{REAL['prefill_compile'] * SCALE:g}",
    }
    data = daemonconfig.sim_config(
        windows(),
        scenario="ok",
        state_dir=wd / "state",
        model_path=str(wd / "model"),
        server_port=free_port(),
        api_port=free_port(),
        env=sim_env,
        args=SPEC_ARGS,
        fallback=list(LADDERS[ladder]),
        watchdog={"on_spec_regression": "fallback"},
        restart={
            "retries_per_rung": 1,
            "hung_stop_grace_s": scaled("hung_stop_grace_s"),
            "stable_s": scaled("stable_s"),
            "start_from": "last_good",
        },
        diagnostics={"native": True, "gdb": "on_hang"},
        gpu_file=gpu_file,
    )
    data["server"]["command"] = [python, str(ROOT / "bench" / "faultserver.py")]
    data["learned"] = {"enabled": False}  # its scaled floor (0.2 s) is under a poll
    settings_from_mapping(data)  # a bad config fails here, not in the daemon
    return data


class ScriptDaemon(Daemon):
    """The daemon under test: `PYTHON -m supervisor run --config FILE`, run from the work directory
    (not this checkout), so `PYTHON`'s own installation is what runs; the rest is bench.common's."""

    def __init__(self, data: dict[str, Any], wd: Path, python: str) -> None:
        self.wd, self.python = wd, python
        self.config = wd / "config.toml"
        self.config.write_text(dump_mapping(data))
        self.api = f"http://127.0.0.1:{data['api']['port']}"
        self.state_dir = Path(data["paths"]["state_dir"])
        self.proc: subprocess.Popen[bytes] | None = None
        self.leftovers: tuple[int, ...] = ()

    def start(self) -> ScriptDaemon:
        with open(self.wd / "daemon.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self.python, "-m", "supervisor", "run", "--config", str(self.config), "--log-json"],
                cwd=self.wd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self

    def post(self, path: str, body: dict[str, Any]) -> None:
        r = httpx.post(f"{self.api}{path}", json=body, timeout=10, trust_env=False)
        if r.status_code != 202:
            raise RuntimeError(f"{path} answered {r.status_code}: {r.text[:200]}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


def capture_rule(onset: Path) -> dict[str, Any]:
    env = {"SGLANG_SIM_SCENARIO": "busy_capture_hang", "SGLANG_SIM_ONSET_FILE": str(onset)}
    return {"unless": ["disable-cuda-graph"], "env": env}


SPEC_RULE: dict[str, Any] = {"with": ["speculative-algorithm"], "env": {"SGLANG_SIM_SCENARIO": "low_accept"}}


def write_control(path: Path, rules: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rules": rules}))
    os.replace(tmp, path)


@dataclass
class Run:
    label: str
    python: str
    ladder: str = "plain"
    rows: list[Row] = field(default_factory=list)
    to_fault_s: float | None = None
    wall_s: float = 0.0
    workdir: str = ""
    error: str = ""


def _first_onset(watcher: OnsetWatcher, timeout: float, what: str) -> float:
    got = wait_for(lambda: list(watcher.onsets), bool, timeout, what=what)
    return got[0].wall


def run_script(label: str, python: str, ladder: str = "plain") -> Run:
    wd = workdir(f"faultscript-{label}-{ladder}")
    control, gpu_file = wd / "control.json", wd / "nvml.json"
    write_gpu_file(gpu_file, [])
    onset_file = [wd / f"onset-{i}.json" for i in range(len(STEPS) + 1)]
    write_control(control, [{"env": {"SGLANG_SIM_SCENARIO": "deadlock_after_load", "SGLANG_SIM_FAULT_ONCE": "1",
                                     "SGLANG_SIM_ONSET_FILE": str(onset_file[1])}}])  # fmt: skip
    data = config(wd, python, control, gpu_file, ladder)
    run = Run(label, python, ladder, [Row(i + 1, s.name) for i, s in enumerate(STEPS)], workdir=str(wd))
    gap = REAL["gap"] * SCALE
    d = ScriptDaemon(data, wd, python)
    t_start = time.monotonic()
    traffic: Traffic | None = None
    daemons = [d]

    def served(row: Row, what: str) -> None:
        assert row.onset is not None
        onset = row.onset
        d.wait_events(lambda ev: ready_after(ev, onset) is not None, STEP_TIMEOUT_S, what)
        time.sleep(gap)

    def rung_now() -> str:
        return str((d.status() or {}).get("rung") or "")

    rows = run.rows
    try:
        d.start()
        # 1: the first launch deadlocks after load, once
        with OnsetWatcher(onset_file[1]) as w:
            rows[0].rung_before = PREFERRED
            rows[0].onset = _first_onset(w, 120, "the deadlock's onset")
        served(rows[0], "ready after the transient deadlock")
        # 2: graph capture hangs on every rung with CUDA graphs; an operator's restart meets it
        write_control(control, [capture_rule(onset_file[2]), SPEC_RULE])
        rows[1].rung_before = rung_now()
        with OnsetWatcher(onset_file[2]) as w:
            d.post("/restart", {"reason": "fault script: driver updated"})
            rows[1].onset = _first_onset(w, 120, "the capture hang's onset")
        served(rows[1], "ready after the capture fault")
        # 3: speculation accepts poorly once clients come
        rows[2].rung_before = rung_now()
        port = int(data["server"]["port"])
        traffic = Traffic(port, concurrency=3, seconds=STEP_TIMEOUT_S).__enter__()
        rows[2].onset = time.time()
        served(rows[2], "ready after the speculative regression")
        traffic.__exit__(None, None, None)
        traffic = None
        write_control(control, [capture_rule(onset_file[4])])
        # 4: an Xid, then the rank it killed
        rows[3].rung_before = rung_now()
        rows[3].onset = inject_xid(d, gpu_file)  # type: ignore[arg-type]
        served(rows[3], "ready after the Xid")
        # 5: the HTTP front end stops
        rows[4].rung_before = rung_now()
        main_pid = int((d.status() or {})["pid"])
        rows[4].onset = time.time()
        os.kill(main_pid, signal.SIGSTOP)
        try:
            served(rows[4], "ready after the stopped front end")
        finally:
            _continue(main_pid)
        # 6: the daemon dies while serving on a fallback rung; a new one on the same state directory
        rows[5].rung_before = rung_now()
        pid_before = (d.status() or {}).get("pid")
        rows[5].onset = time.time()
        d.kill()
        d = ScriptDaemon(data, wd, python)
        daemons.append(d)
        d.start()
        st = d.wait(lambda x: x.get("state") == "ready", STEP_TIMEOUT_S, "ready after the daemon restart")
        _adoption(rows[5], d.events(), pid_before, st)
        time.sleep(gap)
        # 7: promote while the capture fault persists
        write_control(control, [capture_rule(onset_file[7])])
        rows[6].rung_before = rung_now()
        rows[6].onset = time.time()
        with OnsetWatcher(onset_file[7]) as w:
            d.post("/promote", {"reason": "fault script: try the preferred rung"})
            served(rows[6], "ready after the failed promote")
        run.to_fault_s = _to_fault(d.events(), rows[6].onset, w.onsets[0].wall if w.onsets else None)
        # 8: promote after the fix
        write_control(control, [])
        rows[7].rung_before = rung_now()
        rows[7].onset = time.time()
        d.post("/promote", {"reason": "fault script: the driver is fixed"})
        served(rows[7], "ready after the promote")
    except (TimeoutError, RuntimeError, KeyError, StopIteration, httpx.HTTPError) as err:
        run.error = f"{type(err).__name__}: {str(err)[:300]}"
        for row in rows:
            if row.onset is not None and not row.error and ready_after(d.events(), row.onset) is None:
                row.error = run.error[:120]
                break
    finally:
        if traffic is not None:
            traffic.__exit__(None, None, None)
        for one in daemons:
            one.stop()
    run.wall_s = round(time.monotonic() - t_start, 1)
    fill(rows, read_events(d.state_dir), run.to_fault_s)
    return run


def _continue(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def _adoption(row: Row, ev: Sequence[dict[str, Any]], pid_before: object, st: dict[str, Any]) -> None:
    """The daemon restart's row: 0 s and 0 launches when the same server was adopted; else the time
    from the kill to the new server's ready."""
    assert row.onset is not None
    launched = _after(ev, "server_launched", row.onset)
    row.launches = len(launched)
    row.rung_after = str(st.get("rung") or "")
    if not launched and st.get("pid") == pid_before:
        row.outage_s = 0.0
        return
    ready = ready_after(ev, row.onset)
    row.outage_s = None if ready is None else round(parse_ts(str(ready["ts"])) - row.onset, 3)


def _to_fault(ev: Sequence[dict[str, Any]], promote: float | None, onset: float | None) -> float | None:
    """The preferred rung's launch up to its capture hang: the first launch after the promote to the
    hang's onset."""
    if promote is None or onset is None:
        return None
    launched = _after(ev, "server_launched", promote)
    return None if not launched else round(onset - parse_ts(str(launched[0]["ts"])), 3)


# ---- rendering ----------------------------------------------------------------------------------


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _r(x: float | None) -> str:
    return "-" if x is None else ("inf" if x == float("inf") else f"{x:.2f}")


def render_table(run: Run) -> str:
    rows = [
        [
            f"{r.step} {r.name}",
            _s(r.outage_s),
            _s(r.ideal_s),
            _r(r.ratio),
            "-" if r.launches is None else str(r.launches),
            str(r.ideal_launches),
            f"{r.rung_before} -> {r.rung_after or '-'}",
            r.target or "-",
            r.error[:60] or "-",
        ]
        for r in run.rows
    ]
    t = totals(run.rows)
    rows.append(
        [
            "total",
            _s(t.outage_s),
            _s(t.ideal_s),
            _r(t.ratio),
            str(t.launches),
            str(t.ideal_launches),
            f"total {'met' if t.total_met else 'NOT met'} (<= {TOTAL_TARGET}x), rows "
            f"{'met' if t.rows_met else 'NOT met'} (<= {ROW_TARGET:g}x)",
            "",
            run.error[:60] or "-",
        ]
    )
    heads = ["step", "outage s", "ideal s", "ratio", "launches", "ideal launches", "rung", "ideal rung", "error"]
    return table(heads, rows)


def side_by_side(old: Run | None, new: Run | None) -> str:
    def cell(run: Run | None, i: int) -> list[str]:
        if run is None or i >= len(run.rows):
            return ["-"] * 5
        r = run.rows[i]
        launches = "-" if r.launches is None else str(r.launches)
        return [_s(r.outage_s), _s(r.ideal_s), _r(r.ratio), launches, r.rung_after or "-"]

    rows = [[f"{i + 1} {s.name}", *cell(old, i), *cell(new, i), str(ideal_launches(s))] for i, s in enumerate(STEPS)]
    tot: list[str] = ["total"]
    for run in (old, new):
        if run is None:
            tot += ["-"] * 5
            continue
        t = totals(run.rows)
        tot += [_s(t.outage_s), _s(t.ideal_s), _r(t.ratio), str(t.launches), ""]
    rows.append([*tot, str(sum(ideal_launches(s) for s in STEPS))])
    heads = ["step", "old outage", "old ideal", "old ratio", "old launches", "old rung after"]
    heads += ["new outage", "new ideal", "new ratio", "new launches", "new rung after", "ideal launches"]
    return table(heads, rows)


def ideal_launches(step: Step) -> int:
    return ideal(step, Pieces(0.0, 0.0))[1]


def from_json(data: Any) -> Run | None:
    if not isinstance(data, dict) or "rows" not in data:
        return None
    rows = [Row(**r) for r in data["rows"]]
    keep = {k: data[k] for k in ("label", "python", "ladder", "to_fault_s", "wall_s", "workdir", "error") if k in data}
    return Run(rows=rows, **keep)


LADDER_TITLES = {
    "plain": "The ladder without triggers (each rung's `args` only)",
    "on": "The same ladder with `on` triggers (`no-cuda-graph` on `cuda_graph_capture`, `no-spec` on "
    "`spec_regression`)",
}


def result_name(label: str, ladder: str) -> str:
    return f"outage-script-{label}-{ladder}"


def render(runs: dict[tuple[str, str], Run]) -> str:
    """The section: per ladder, old and new side by side, then each run's own table."""
    intro = (
        f"A scripted day of faults on the simulator (bench/faultscript.py's docstring: the ladder, the faults, "
        f"the oracle's rule per step): one daemon on a fresh state directory, every production duration "
        f"scaled by {SCALE:g} (a 25-minute load takes {REAL['load'] * SCALE:g} s; `startup_stall_s` "
        f"{scaled('startup_stall_s'):g} s, `spec_window_s` {scaled('spec_window_s'):g} s, health every "
        f"{scaled('health_interval_s'):g} s with a {scaled('health_timeout_s'):g} s timeout and {HEALTH_FAILURES} "
        f"failures, `stable_s` {scaled('stable_s'):g} s, backoff {scaled('backoff_initial_s'):g} to "
        f"{scaled('backoff_max_s'):g} s; floors where a 2-core machine cannot honour less; poll {POLL_S:g} s), "
        f"faults {REAL['gap'] * SCALE:g} s apart. Outage: the fault's onset to the journal's next `server_ready`; "
        "ideal: the oracle's (it knows the fault, so it decides at once when its window ends and captures "
        "nothing) with this run's own stop and launch times; launches: `server_launched` from the onset to "
        f"that ready. Targets (issue 49): total within {TOTAL_TARGET}x, every row within {ROW_TARGET:g}x. "
        "Old: the daemon before this round (commit 011814c), new: this round's recovery policy."
    )
    body = header("Outage: the fault script", "outage-script", intro)
    body = body.replace(
        "Reproduce: `.venv/bin/python -m bench.run_all --only outage-script`.",
        "Reproduce: `.venv/bin/python -m bench.outage --script day --label new --ladder plain` (and `--ladder on`; "
        "`--label old --daemon-python /path/to/old/.venv/bin/python` for the old daemon).",
    )
    parts = [body]
    for ladder, title in LADDER_TITLES.items():
        old, new = runs.get(("old", ladder)), runs.get(("new", ladder))
        if old is None and new is None:
            continue
        parts += [f"### {title}", "", side_by_side(old, new), ""]
        for name, run in (("Old code", old), ("New code", new)):
            if run is None:
                parts += [f"{name}: not measured.", ""]
                continue
            parts += [
                f"{name} (daemon under `{run.python}`; the script ran {run.wall_s:g} s):",
                "",
                render_table(run),
                "",
            ]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--script", choices=["day"], default="day")
    p.add_argument("--daemon-python", default=sys.executable, help="the interpreter the daemon runs under")
    p.add_argument("--label", choices=["old", "new"], default="new", help="which column of the table this run fills")
    p.add_argument(
        "--ladder", choices=sorted(LADDERS), default="plain", help="the ladder without or with `on` triggers"
    )
    p.add_argument("--no-write", action="store_true", help="print, do not write docs/BENCHMARKS.md")
    a = p.parse_args(argv)
    # absolute, not resolved: the daemon starts in its work directory, and a venv's python is a link
    run = run_script(a.label, os.path.abspath(a.daemon_python), a.ladder)
    print(f"fault script {a.label} {a.ladder}: {json.dumps(asdict(run), default=str)}", flush=True)
    save_result(result_name(a.label, a.ladder), asdict(run))
    runs = {
        (label, ladder): got
        for label in ("old", "new")
        for ladder in LADDERS
        if (got := from_json(load_result(result_name(label, ladder)))) is not None
    }
    runs[(a.label, a.ladder)] = run
    print(render_table(run), flush=True)
    body = render(runs)
    if a.no_write:
        print(body)
    else:
        publish("outage-script", body)
    t = totals(run.rows)
    return 0 if not run.error and all(r.outage_s is not None for r in run.rows) and t.ratio is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
