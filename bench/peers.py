"""Peers, same simulator, same run: supervisord 4.3 with its recommended options, and a
Kubernetes-style probe policy evaluated over the observation traces recorded here.

supervisord is installed from the package index into its own venv (`/tmp/svd`, created when
missing) and runs the simulator with `stopasgroup`/`killasgroup`, `autorestart`, `startretries 3`,
`stopwaitsecs` equal to the daemon's stop grace. While it runs, a kubelet-like prober here GETs
`/health` every second (5 s timeout) and records a trace; the Kubernetes policy (a startup probe
whose budget allows a 25-minute load, then a liveness probe on `/health`) is applied to that
trace. That is a policy evaluation, not a cluster: no kubelet, no container runtime.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import threading
import time
import uuid
import xmlrpc.client
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.common import (
    PY,
    ROOT,
    Traffic,
    W,
    free_port,
    header,
    load_result,
    median,
    publish,
    save_result,
    sim_env,
    workdir,
)
from bench.report import table
from probes.ports import port_holders
from probes.proctree import MARKER_ENV
from supervisor.process import kill_marked

SVD = Path(os.environ.get("SGLANG_BENCH_SUPERVISORD_VENV", "/tmp/svd"))
SVD_VERSION = "4.3.0"
OBSERVE_S = 40.0  # after the onset: several times the daemon's longest window, and three liveness periods
STARTSECS = 10  # sized past the simulator's load, as one would size it past SGLang's


def ensure_supervisord() -> str:
    """The venv with supervisord 4.3, created with the package index's ordinary client if missing."""
    exe = SVD / "bin" / "supervisord"
    if not exe.exists():
        subprocess.run(["python3", "-m", "venv", str(SVD)], check=True)
        subprocess.run([str(SVD / "bin" / "pip"), "install", "-q", f"supervisor=={SVD_VERSION}"], check=True)
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True).stdout.strip()
    return out


# ---- a kubelet-like prober ----------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t: float  # monotonic time the request started
    status: int | None
    latency_s: float
    error: str = ""

    def ok(self, timeout_s: float) -> bool:
        return self.status == 200 and self.latency_s <= timeout_s


class Prober:
    """GET /health every `period_s`, one at a time, each bounded by `timeout_s`."""

    def __init__(self, port: int, period_s: float = 1.0, timeout_s: float = 5.0) -> None:
        self.port, self.period_s, self.timeout_s = port, period_s, timeout_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)

    def start(self) -> Prober:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 2)

    def _run(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            t = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
            try:
                conn.request("GET", "/health")
                resp = conn.getresponse()
                resp.read()
                self.samples.append(Sample(t, resp.status, time.monotonic() - t))
            except (OSError, http.client.HTTPException) as err:
                self.samples.append(Sample(t, None, time.monotonic() - t, type(err).__name__))
            finally:
                conn.close()
            nxt += self.period_s
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def first_ok_after(self, t: float) -> float | None:
        return next((s.t for s in self.samples if s.t >= t and s.status == 200), None)


# ---- the Kubernetes policy, evaluated on a trace ---------------------------------------------


@dataclass(frozen=True)
class ProbeSpec:
    period_s: float
    timeout_s: float
    failure_threshold: int


STARTUP = ProbeSpec(period_s=10, timeout_s=5, failure_threshold=150)  # 150 x 10 s: a 25-minute load fits
LIVENESS = ProbeSpec(period_s=10, timeout_s=5, failure_threshold=3)


@dataclass(frozen=True)
class PolicyOutcome:
    restart_at: float | None  # seconds after the container start; None: never
    probe: str  # which probe restarts it
    extrapolated: bool  # the trace ended first; the last observed answer is assumed to persist
    probes_ok: int
    probes: int


def evaluate(samples: list[Sample], start: float) -> PolicyOutcome:
    """Kubelet's probes over a trace. The startup probe fails every `period` from `start` until the
    first healthy answer; it is taken to pass at that answer (the best case for it: a 10 s period
    could miss a server that, in this compressed simulator, hangs seconds after ready). Liveness
    then probes every `period`; a restart when `failure_threshold` probes fail in a row, once the
    last one has failed. A probe's answer is the trace sample nearest its time."""
    ready = next((x.t for x in samples if x.ok(STARTUP.timeout_s)), None)
    end = samples[-1].t if samples else start
    if ready is None:
        n = STARTUP.failure_threshold
        at = (n - 1) * STARTUP.period_s + STARTUP.timeout_s
        return PolicyOutcome(at, "startup", start + at > end, 0, int((end - start) // STARTUP.period_s) + 1)
    fails = oks = total = 0
    last: bool | None = None
    t = ready + LIVENESS.period_s
    while t <= end:
        near = [x for x in samples if abs(x.t - t) <= 2.5]
        if near:
            s = min(near, key=lambda x: abs(x.t - t))
            last = s.ok(LIVENESS.timeout_s)
            total += 1
            oks += last
            fails = 0 if last else fails + 1
            if fails >= LIVENESS.failure_threshold:
                return PolicyOutcome(t + min(s.latency_s, LIVENESS.timeout_s) - start, "liveness", False, oks, total)
        t += LIVENESS.period_s
    if last is False:  # the fault persists beyond the trace: count the remaining probes
        left = LIVENESS.failure_threshold - fails - 1
        return PolicyOutcome(t - start + left * LIVENESS.period_s, "liveness", True, oks, total)
    return PolicyOutcome(None, "liveness", False, oks, total)


# ---- supervisord ----------------------------------------------------------------------------


@dataclass
class SvdRun:
    scenario: str
    startsecs: int = STARTSECS
    traffic: bool = False
    env: dict[str, str] = field(default_factory=dict)
    wd: Path = field(default_factory=Path)
    port: int = 0
    rpc_port: int = 0
    marker: str = ""
    proc: subprocess.Popen[bytes] | None = None
    timeline: list[tuple[float, str, int]] = field(default_factory=list)  # (t, state, pid)
    started_at: float = 0.0
    prober: Prober | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def conf(self) -> str:
        env = {
            **sim_env(self.scenario),
            "SGLANG_SIM_ONSET_FILE": str(self.wd / "onset.json"),
            MARKER_ENV: self.marker,  # bookkeeping for this benchmark only: supervisord ignores it
            **self.env,
        }
        env_line = ",".join(f'{k}="{v}"' for k, v in env.items())
        argv = [
            PY, "-m", "supervisor.simulator", "--model-path", str(self.wd / "model"), "--tp-size", "2",
            "--enable-metrics", "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        return f"""[supervisord]
nodaemon=true
logfile={self.wd}/supervisord.log
pidfile={self.wd}/supervisord.pid
childlogdir={self.wd}

[inet_http_server]
port=127.0.0.1:{self.rpc_port}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[program:sglang]
command={" ".join(argv)}
directory={ROOT}
environment={env_line}
autostart=true
autorestart=true
startsecs={self.startsecs}
startretries=3
stopsignal=TERM
stopwaitsecs={int(W.stop_grace_s)}
stopasgroup=true
killasgroup=true
redirect_stderr=true
stdout_logfile={self.wd}/program.log
"""

    @property
    def rpc(self) -> Any:
        return xmlrpc.client.ServerProxy(f"http://127.0.0.1:{self.rpc_port}/RPC2").supervisor

    def start(self) -> SvdRun:
        self.wd = workdir(f"peers-{self.scenario}-s{self.startsecs}")
        self.port, self.rpc_port = free_port(), free_port()
        self.marker = f"bench-svd-{uuid.uuid4().hex[:12]}"
        conf = self.wd / "supervisord.conf"
        conf.write_text(self.conf())
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        out = open(self.wd / "supervisord.out", "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [str(SVD / "bin" / "supervisord"), "-n", "-c", str(conf)], cwd=self.wd, env=env, stdout=out, stderr=out
        )
        out.close()
        self.started_at = time.monotonic()
        self.prober = Prober(self.port).start()
        threading.Thread(target=self._watch, name=f"svd-{self.scenario}", daemon=True).start()
        return self

    def _watch(self) -> None:
        last: tuple[str, int] | None = None
        while not self._stop.wait(0.2):
            try:
                info = self.rpc.getProcessInfo("sglang")
            except (OSError, xmlrpc.client.Error):
                continue
            now = (str(info["statename"]), int(info["pid"]))
            if now != last:
                self.timeline.append((time.monotonic(), *now))
                last = now

    def state(self) -> str:
        return self.timeline[-1][1] if self.timeline else "?"

    def starts(self) -> int:
        return len({pid for _, st, pid in self.timeline if pid and st in ("STARTING", "RUNNING")})

    def onset(self, timeout: float = 60.0) -> float | None:
        """The fault's monotonic onset from the simulator's side file."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                rec = json.loads((self.wd / "onset.json").read_text())
                if rec.get("onset_monotonic") is not None:
                    return float(rec["onset_monotonic"])
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        return None

    def wait_ready(self, timeout: float = 60.0) -> float:
        assert self.prober is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.prober.samples and self.prober.samples[-1].status == 200:
                return self.prober.samples[-1].t
            time.sleep(0.2)
        raise TimeoutError(f"{self.scenario}: /health never answered 200 under supervisord ({self.wd})")

    def members(self) -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            try:
                env = Path(f"/proc/{p.pid}/environ").read_bytes()
                if f"{MARKER_ENV}={self.marker}".encode() in env and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except (OSError, psutil.Error):
                continue
        return found

    def log_has(self, text: str) -> int:
        try:
            return (self.wd / "program.log").read_text(errors="replace").count(text)
        except OSError:
            return 0

    def shutdown(self) -> None:
        """Stop supervisord (it stops its program its own way), then count and end what is left."""
        if self.prober is not None:
            self.prober.stop()
        self._stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        left = self.members()
        self.facts["left_after_supervisord_stop"] = [p.pid for p in left]
        kill_marked(self.marker, grace_s=0.5)


# ---- scenarios ------------------------------------------------------------------------------


def observe(scenario: str, traffic: bool = False) -> dict[str, Any]:
    """Run the fault under supervisord for OBSERVE_S past its onset: does supervisord react?"""
    run = SvdRun(scenario, traffic=traffic).start()
    try:
        tr = Traffic(run.port, concurrency=3, seconds=OBSERVE_S + 60) if traffic else None
        if tr is not None:
            tr.__enter__()
        try:
            onset = run.onset()
            if onset is None:
                return {"error": "no onset"}
            time.sleep(max(0.0, onset + OBSERVE_S - time.monotonic()))
        finally:
            if tr is not None:
                tr.__exit__(None, None, None)
        assert run.prober is not None
        samples = list(run.prober.samples)
        after = [s for s in samples if s.t >= onset]
        policy = evaluate(samples, run.started_at)
        return {
            "observed_s": round(time.monotonic() - onset, 1),
            "state": run.state(),
            "starts": run.starts(),
            "restarts_after_onset": sum(1 for t, st, _ in run.timeline if st == "STARTING" and t > onset),
            "health_after_onset": f"{sum(s.status == 200 for s in after)}/{len(after)} answered 200",
            "policy": policy.__dict__,
            "policy_from_onset_s": None
            if policy.restart_at is None
            else round(policy.restart_at - (onset - run.started_at), 1),
            "onset_after_start_s": round(onset - run.started_at, 1),
            "trace": [(round(s.t - run.started_at, 2), s.status, round(s.latency_s, 3), s.error) for s in samples],
        }
    finally:
        run.shutdown()
        print(f"peers {scenario}: {run.state()} starts {run.starts()} {run.facts}", flush=True)


CRASH_ENV = {"SGLANG_SIM_SHARD_S": "0.5"}  # the OOM comes at shard 4: about 3 s after the start


def crash_loop(startsecs: int) -> dict[str, Any]:
    run = SvdRun("crash_on_load", startsecs=startsecs, env=CRASH_ENV).start()
    try:
        end = time.monotonic() + OBSERVE_S + 15
        while time.monotonic() < end and run.state() != "FATAL":
            time.sleep(0.2)
        fatal = next((t for t, st, _ in run.timeline if st == "FATAL"), None)
        return {
            "startsecs": startsecs,
            "state": run.state(),
            "starts": run.starts(),
            "fatal_after_s": None if fatal is None else round(fatal - run.started_at, 1),
            "observed_s": round(time.monotonic() - run.started_at, 1),
            "oom_tracebacks": run.log_has("CUDA out of memory"),
        }
    finally:
        run.shutdown()


def restart_fight(scenario: str) -> dict[str, Any]:
    """A ready server whose tree fights the stop: supervisord's stop, then start."""
    run = SvdRun(scenario).start()
    result: dict[str, Any] = {}
    try:
        run.wait_ready()
        before = {p.pid for p in run.members()}
        t0 = time.monotonic()
        run.rpc.stopProcess("sglang", True)
        stop_s = time.monotonic() - t0
        time.sleep(0.5)
        survivors = [p.pid for p in run.members()]
        holders = port_holders(run.port)
        t1 = time.monotonic()
        try:
            run.rpc.startProcess("sglang", False)
        except xmlrpc.client.Fault as err:
            run.facts["start_fault"] = err.faultString
        time.sleep(OBSERVE_S * 0.75)
        assert run.prober is not None
        ready = run.prober.first_ok_after(t1)
        result = {
            "members_before": len(before),
            "stop_s": round(stop_s, 2),
            "survivors": survivors,
            "port_held_by": list(holders or ()),
            "starts_after": sum(1 for t, st, _ in run.timeline if st == "STARTING" and t > t1),
            "state": run.state(),
            "ready_after_start_s": None if ready is None else round(ready - t1, 2),
            "bind_errors": run.log_has("address already in use"),
        }
    finally:
        run.shutdown()
        print(f"peers {scenario}: {run.state()} {run.facts}", flush=True)
    result["left_after_supervisord_stop"] = run.facts.get("left_after_supervisord_stop", [])
    return result


def in_threads(jobs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}

    def go(name: str, fn: Any, args: tuple[Any, ...]) -> None:
        try:
            out[name] = fn(*args)
        except Exception as err:  # one peer run failing must not lose the others
            out[name] = {"error": f"{type(err).__name__}: {err}"}

    threads = [threading.Thread(target=go, args=(n, f, a)) for n, (f, a) in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# ---- report ---------------------------------------------------------------------------------


def _daemon_detect(det: list[dict[str, Any]] | None, scenario: str) -> str:
    row = next((r for r in det or [] if r["scenario"] == scenario), None)
    if row is None or not row["delays_s"]:
        return "see Detection"
    return f"`{row['cause_expected']}` in {median(row['delays_s']):.1f} s (max {max(row['delays_s']):.1f})"


def _policy(obs: dict[str, Any]) -> str:
    if "error" in obs:
        return f"error: {obs['error']}"
    p = obs["policy"]
    if p["restart_at"] is None:
        return f"never: {p['probes_ok']}/{p['probes']} liveness probes passed; no evidence"
    when = f"{obs['policy_from_onset_s']:.0f} s after onset"
    how = " (trace ended first: the failing answer is assumed to persist)" if p["extrapolated"] else ""
    return f"restart by the {p['probe']} probe {when}{how}; no evidence, same config"


def _crash_text(c: dict[str, Any]) -> str:
    if "error" in c or not c:
        return f"error: {c.get('error', 'not run')}"
    head = f"startsecs {c['startsecs']}: {c['starts']} starts"
    if c["state"] == "FATAL":
        return f"{head}, then `FATAL` after {c['fatal_after_s']} s: stays down, no other config tried"
    return f"{head} in {c['observed_s']:.0f} s, still `{c['state']}`: restarts the same config without end"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _sum(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a + b:.2f}"


def _svd_observed(obs: dict[str, Any]) -> str:
    if "error" in obs:
        return f"error: {obs['error']}"
    return (
        f"not noticed: `{obs['state']}` {obs['observed_s']:.0f} s after onset, "
        f"{obs['restarts_after_onset']} restarts; /health {obs['health_after_onset']}"
    )


def render(version: str, obs: dict[str, dict[str, Any]], loops: dict[str, dict[str, Any]], det: Any, rec: Any) -> str:
    rec_ladder = (rec or {}).get("ladder", {})
    rec_fights = {x["scenario"]: x for x in (rec or {}).get("fights", [])}

    def ready_on_fallback(scenario: str) -> str:
        xs = [x["total_s"] for x in rec_ladder.get(scenario, []) if x.get("total_s") is not None]
        return f"; fallback rung ready {median(xs):.1f} s after onset" if xs else ""

    rows = []
    for scenario in ("deadlock_after_load", "health_hangs", "serving_stall", "rank_dies"):
        o = obs.get(scenario, {"error": "not run"})
        rows.append(
            [
                f"`{scenario}`",
                _daemon_detect(det, scenario) + ready_on_fallback(scenario) + ", bundle kept",
                _svd_observed(o),
                _policy(o),
            ]
        )
    c10, c1 = loops.get("crash10", {}), loops.get("crash1", {})
    rows.append(
        [
            "`crash_on_load` (crash loop)",
            _daemon_detect(det, "crash_on_load")
            + ready_on_fallback("crash_on_load")
            + "; retries, backoff, hourly budget, then `failed`",
            _crash_text(c10) + "; " + _crash_text(c1),
            "container exits: CrashLoopBackOff (10 s doubling to 300 s) forever, same config",
        ]
    )
    esc, ign = loops.get("escape_group", {}), loops.get("ignore_sigterm", {})
    de, di = rec_fights.get("escape_group", {}), rec_fights.get("ignore_sigterm", {})
    rows.append(
        [
            "restart after `escape_group`",
            f"helper found by marker and stopped; port free; ready {_f(de.get('total_s'))} s after `/restart`, "
            f"left behind {len(de.get('survivors', [])) + de.get('left_after_daemon', 0)}",
            f"stop left {len(esc.get('survivors', []))} process(es) alive holding the port (pid "
            f"{esc.get('port_held_by')}); new instance: {esc.get('bind_errors')} `address already in use`, "
            f"{esc.get('starts_after')} starts, `{esc.get('state')}`; /health "
            f"{'never 200 again' if esc.get('ready_after_start_s') is None else 'back'}; "
            f"{len(esc.get('left_after_supervisord_stop', []))} still alive after supervisord itself stopped"
            if "error" not in esc
            else f"error: {esc['error']}",
            "n/a: the runtime kills every process of the container's cgroup",
        ]
    )
    rows.append(
        [
            "restart after `ignore_sigterm`",
            f"SIGKILL after the {W.stop_grace_s:g} s grace: stop {_f(di.get('stop_s'))} s, left behind "
            f"{len(di.get('survivors', [])) + di.get('left_after_daemon', 0)}, "
            f"ready {_f(di.get('total_s'))} s after the restart",
            f"SIGKILL to the group after stopwaitsecs: stop {_f(ign.get('stop_s'))} s, left behind "
            f"{len(ign.get('survivors', []))}, ready {_sum(ign.get('stop_s'), ign.get('ready_after_start_s'))} s "
            "after the restart"
            if "error" not in ign
            else f"error: {ign['error']}",
            "SIGKILL after terminationGracePeriodSeconds (30 s by default)",
        ]
    )
    intro = (
        f"Same simulator, same windows ({W.describe()}), tp 2. sglang-supervisor figures come from the "
        f"Detection and Recovery sections of this run. supervisord: {version}, `autorestart=true`, "
        f"`startsecs={STARTSECS}` (sized past the load), `startretries=3`, `stopwaitsecs={W.stop_grace_s:g}`, "
        "`stopasgroup=true`, `killasgroup=true`; the crash loop also with the default `startsecs=1` and a crash "
        "about 3 s after each start; "
        "each fault watched for "
        f"{OBSERVE_S:g} s past its onset. Kubernetes column: a **policy evaluation, not a cluster**: a startup "
        f"probe on `/health` (period {STARTUP.period_s:g} s, timeout {STARTUP.timeout_s:g} s, failureThreshold "
        f"{STARTUP.failure_threshold}: a {STARTUP.period_s * STARTUP.failure_threshold / 60:g}-minute budget so a "
        f"25-minute load survives), then liveness on `/health` (period {LIVENESS.period_s:g} s, timeout "
        f"{LIVENESS.timeout_s:g} s, failureThreshold {LIVENESS.failure_threshold}), applied to the `/health` trace "
        "recorded every second (5 s timeout) while supervisord ran the same fault. Kubernetes times are its real "
        "parameters; the simulator's are compressed (pace 0.2, a 2 s SGLang health timeout), which favours the "
        "probes."
    )
    tbl = table(["fault", "sglang-supervisor", f"supervisord {SVD_VERSION}", "Kubernetes probes (policy)"], rows)
    return header("Peers: supervisord and Kubernetes probes on the same faults", "peers", intro) + "\n" + tbl + "\n"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    version = f"supervisord {ensure_supervisord()}"
    obs = in_threads(
        {
            "deadlock_after_load": (observe, ("deadlock_after_load",)),
            "health_hangs": (observe, ("health_hangs",)),
            "serving_stall": (observe, ("serving_stall", True)),
            "rank_dies": (observe, ("rank_dies",)),
        }
    )
    loops = in_threads(
        {
            "crash10": (crash_loop, (STARTSECS,)),
            "crash1": (crash_loop, (1,)),
            "escape_group": (restart_fight, ("escape_group",)),
            "ignore_sigterm": (restart_fight, ("ignore_sigterm",)),
        }
    )
    save_result("peers", {"version": version, "observe": obs, "loops": loops})
    publish("peers", render(version, obs, loops, load_result("detection"), load_result("recovery")))
    return 0 if not any("error" in x for x in [*obs.values(), *loops.values()]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
