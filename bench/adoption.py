"""Adoption: a daemon restart under steady /generate load, against the simulator on loopback.

Three ways the daemon goes away while the server serves: SIGKILL (a crash or a systemd watchdog
abort) with the daemon away for `--gap` seconds; the SIGUSR2 upgrade handoff (the daemon
re-executes itself in place); SIGKILL while a `POST /diagnose` capture runs. For each: server restarts
(`server_launched` after the first launch; target 0), requests that failed over the whole run
(target 0), server log lines lost (requests answered 200 minus the simulator's access lines in
`logs/`; target 0), and the time from the new daemon's start until `/status` shows the same pid
`ready`. Then a record naming a stranger's pid and true start time: never adopted.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Daemon, Traffic, header, median, publish, save_result, sim_settings, workdir
from bench.report import table
from supervisor.common.waiting import WaitTimeout, wait_for

ACCESS = '"POST /generate HTTP/1.1" 200'
MODES = ("sigkill", "handoff", "sigkill_during_capture")


@dataclass
class Run:
    mode: str
    server_restarts: int = -1
    requests_ok: int = 0
    requests_failed: int = 0
    lines_lost: int = -1
    ready_s: float | None = None
    same_pid: bool = False
    capture_running: bool | None = None
    error: str = ""


def access_lines(state_dir: Path) -> int:
    return sum(f.read_bytes().count(ACCESS.encode()) for f in (state_dir / "logs").glob("server.log*"))


def settle(state_dir: Path, timeout: float = 10.0) -> int:
    """The access-line count once it stops growing (the keeper writes the last lines after the load)."""
    last, deadline = -1, time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = access_lines(state_dir)
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    return last


def wait_diagnosing(d: Daemon, timeout: float) -> bool:
    def diagnosing(st: dict[str, Any]) -> bool:
        return bool(st.get("diagnosing") or st.get("state") == "diagnosing")

    try:
        wait_for(d.status, diagnosing, timeout, interval=0.02)
    except WaitTimeout:
        return False
    return True


def one(mode: str, gap_s: float) -> Run:
    run = Run(mode)
    wd = workdir(f"adoption-{mode}")
    s = sim_settings(wd, "ok", tp=2)
    d = Daemon(s, wd).start()
    try:
        pid = d.wait(lambda x: x["state"] == "ready", 90, "ready")["pid"]
        before = access_lines(s.state_dir)
        with Traffic(s.server.port, concurrency=3, seconds=600) as traffic:
            time.sleep(2.0)
            assert d.proc is not None
            if mode == "handoff":  # the daemon re-executes itself in place and adopts the server
                t0 = time.monotonic()
                d.proc.send_signal(signal.SIGUSR2)
                deadline = t0 + 30
                while not any(e["event"] == "server_adopted" for e in d.events()) and time.monotonic() < deadline:
                    if d.proc.poll() is not None:
                        run.error = f"handoff exit {d.proc.returncode}"
                        break
                    time.sleep(0.02)
            else:
                if mode == "sigkill_during_capture":
                    diag = subprocess.Popen(
                        [sys.executable, "-c", f"import httpx; httpx.post('{d.api}/diagnose', json={{}}, timeout=60)"],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    run.capture_running = wait_diagnosing(d, 10)
                d.proc.kill()
                d.proc.wait(10)
                if mode == "sigkill_during_capture":
                    diag.wait(60)
                time.sleep(gap_s)  # the daemon stays away; the load goes on
                t0 = time.monotonic()
                d.start()
            st = d.wait(lambda x: x["state"] == "ready" and x["pid"] == pid, 60, "ready again")
            run.ready_s = round(time.monotonic() - t0, 3)
            run.same_pid = st["pid"] == pid
            time.sleep(2.0)
        summary = traffic.summary
        run.requests_ok = int(summary.get("ok", 0))
        run.requests_failed = int(summary.get("failed", 0)) + int(summary.get("http_error", 0))
        run.lines_lost = run.requests_ok - (settle(s.state_dir) - before)
        run.server_restarts = sum(e["event"] == "server_launched" for e in d.events()) - 1
    except Exception as err:  # a failed run is a row with its error, not a crash of the benchmark
        run.error = f"{type(err).__name__}: {err}"[:300]
    finally:
        d.stop()
    return run


def stranger_refused() -> dict[str, Any]:
    """A saved record with a live stranger's pid and true start time: refused, stranger untouched."""
    wd = workdir("adoption-stranger")
    s = sim_settings(wd, "ok", tp=1)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    out: dict[str, Any] = {}
    try:
        starttime = int(Path(f"/proc/{stranger.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        s.state_dir.mkdir(parents=True, exist_ok=True)
        server = {"pid": stranger.pid, "starttime": starttime, "rung": "base", "launched_wall": 1.0, "log": None}
        doc = {"version": 1, "marker": "feedfacecafebeef", "rungs": ["base"], "current": "base", "server": server}
        (s.state_dir / "state.json").write_text(json.dumps(doc))
        with Daemon(s, wd) as d:
            st = d.wait(lambda x: x["state"] == "ready", 90, "ready")
            refused = [e for e in d.events() if e["event"] == "adoption_refused"]
            out = {
                "adopted": any(e["event"] == "server_adopted" for e in d.events()),
                "reason": refused[0]["reason"] if refused else "",
                "new_pid_differs": st["pid"] != stranger.pid,
            }
        out["stranger_alive"] = stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait(5)
    return out


def render(runs: list[Run], stranger: dict[str, Any], gap_s: float) -> str:
    intro = (
        f"Simulator (tp 2) under 3 concurrent `/generate` clients (bench/load.py). `sigkill`: the daemon is "
        f"SIGKILLed and started again {gap_s:g} s later; `handoff`: SIGUSR2, the daemon re-executes "
        "itself in place (same pid, no systemd restart; Ready is timed from the signal); "
        f"`sigkill_during_capture`: SIGKILL while a `POST /diagnose` capture runs, then {gap_s:g} s away. "
        "Lines lost: requests answered 200 minus the simulator's access lines in the log files. Ready: from the "
        "new daemon's start to `/status` showing the same server pid `ready`."
    )
    rows = []
    for mode in MODES:
        rs = [r for r in runs if r.mode == mode]
        ok = [r for r in rs if not r.error]
        ready = [r.ready_s for r in ok if r.ready_s is not None]
        rows.append(
            [
                mode,
                len(rs),
                sum(max(r.server_restarts, 0) for r in ok),
                sum(r.requests_ok for r in ok),
                sum(r.requests_failed for r in ok),
                sum(max(r.lines_lost, 0) for r in ok) if ok else "-",
                f"{median(ready):.2f} / {max(ready):.2f}" if ready else "-",
                "; ".join(r.error for r in rs if r.error) or "",
            ]
        )
    tbl = table(
        [
            "daemon went away by",
            "runs",
            "server restarts (target 0)",
            "requests ok",
            "requests failed (target 0)",
            "log lines lost (target 0)",
            "ready again, median / max s",
            "errors",
        ],
        rows,
    )
    captured = [r.capture_running for r in runs if r.mode == "sigkill_during_capture"]
    verdict = (
        f"A record naming a live stranger's pid with its true start time (only the marker differs): "
        f'adopted: {stranger.get("adopted")}; refused because "{stranger.get("reason", "")}"; the stranger '
        f"still alive: {stranger.get('stranger_alive')}; the daemon launched its own server: "
        f"{stranger.get('new_pid_differs')}. Captures that were running when the daemon was killed: "
        f"{sum(bool(c) for c in captured)} of {len(captured)}."
    )
    return (
        header("Adoption: daemon restarts keep the server serving", "adoption", intro)
        + "\n"
        + tbl
        + "\n\n"
        + verdict
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--gap", type=float, default=3.0, help="seconds the SIGKILLed daemon stays away")
    a = p.parse_args(argv)
    runs = []
    for mode in MODES:
        for _ in range(a.reps):
            r = one(mode, a.gap)
            print(f"adoption {mode}: {r.__dict__}", flush=True)
            runs.append(r)
    stranger = stranger_refused()
    print(f"adoption stranger: {stranger}", flush=True)
    save_result("adoption", {"runs": [r.__dict__ for r in runs], "stranger": stranger})
    publish("adoption", render(runs, stranger, a.gap))
    good = all(
        not r.error and r.server_restarts == 0 and r.requests_failed == 0 and r.lines_lost == 0 and r.same_pid
        for r in runs
    )
    return 0 if good and not stranger.get("adopted") and stranger.get("stranger_alive") else 1


if __name__ == "__main__":
    raise SystemExit(main())
