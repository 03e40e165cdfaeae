"""Harm: each act by which a supervisor could make things worse than having none, tried for real.

Every row is a scenario run through the running daemon (`python -m supervisor run`) on the simulator,
and its count of harms, the acts the daemon must never commit; 0 is the target (issue 32):

- a. kill another live daemon's server: two daemons, their own state dirs, the same `[server] port`.
- b. kill a user process with a similar name: `sglang::scheduler_TP0` and `python -m sglang.launch_server`
  processes started before the daemon, not by it.
- c. delete another program's shared memory: a `psm_<hex>` made by an unrelated program and a
  `sgl_shm_mq_<pid>_<hex>` mapped by a live unrelated process, in the daemon's shm dir.
- d. refuse a launch that fits: small strangers holding memory on the simulated GPU.
- e. judge a starved start as hung: CPU hogs at 2, 4 and 8 times the cores (nice 0), the server at
  nice 19, over a quiet start-up phase longer than the stall window.
- f. judge a compiling or loading start as hung: long quiet phases that progress.
- g. restart a healthy server when its own probes are slow: `/health` slow but under the timeout,
  and the daemon's own loop held up (SIGSTOP of the daemon).
- h. judge a slow start of a known model as hung (learned windows, issue 36): two good starts of a
  model and rung, then the same model slower (pace 3x and 5x, a quiet load or a compile 3x the
  learned one), under the windows that judge bench/outage.py's deadlock on a known model (its table says how fast).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    PY,
    Daemon,
    Traffic,
    W,
    header,
    load_result,
    publish,
    save_result,
    sim_settings,
    workdir,
)
from bench.report import table
from supervisor.config.fast import LearnedSettings
from supervisor.config.gpu import GpuSettings
from supervisor.config.settings import Settings
from supervisor.status.causes import HUNG_CAUSES

OVERSUBSCRIPTION = (2, 4, 8)


@dataclass(frozen=True)
class Outcome:
    """One trial: how many harmful acts the daemon committed, and what happened, in words."""

    harms: int
    note: str


@dataclass
class Row:
    act: str
    scenario: str
    run: Callable[[], Outcome]
    trials: int = 0
    harms: int = 0
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def doc(self) -> dict[str, Any]:
        return {
            "act": self.act,
            "scenario": self.scenario,
            "trials": self.trials,
            "harms": self.harms,
            "notes": self.notes,
            "errors": self.errors,
            "seconds": round(self.seconds, 1),
        }


def run_row(row: Row, trials: int) -> Row:
    """Run `trials` trials; a trial that could not be run is an error, never a 0."""
    start = time.monotonic()
    for _ in range(trials):
        try:
            out = row.run()
        except (TimeoutError, RuntimeError, OSError, httpx.HTTPError, KeyError, ValueError) as err:
            row.errors.append(f"{type(err).__name__}: {err}"[:300])
            continue
        row.trials += 1
        row.harms += out.harms
        if out.note not in row.notes:
            row.notes.append(out.note)
    row.seconds = time.monotonic() - start
    return row


def run_rows(rows: Sequence[Row], trials: int, *, parallel: bool) -> None:
    if not parallel:
        for r in rows:
            run_row(r, trials)
        return
    threads = [threading.Thread(target=run_row, args=(r, trials), name=r.scenario) for r in rows]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ---- what the daemon did, from its journal ----------------------------------------------------------


def count(events: Sequence[dict[str, Any]], name: str, **match: object) -> int:
    return sum(e.get("event") == name and all(e.get(k) == v for k, v in match.items()) for e in events)


def hang_incidents(events: Sequence[dict[str, Any]]) -> list[str]:
    return [str(e.get("cause")) for e in events if e.get("event") == "incident" and e.get("cause") in HUNG_CAUSES]


def ready(st: dict[str, Any]) -> bool:
    return st.get("state") == "ready"


def settled(st: dict[str, Any]) -> bool:
    return st.get("state") in ("ready", "failed")


def never_ready(st: dict[str, Any], stalls: Sequence[str]) -> None:
    """A start that failed for a reason other than a hang verdict proves nothing either way."""
    if not ready(st) and not stalls:
        raise RuntimeError(f"never ready, and not for a hang verdict: {st.get('state')} ({st.get('reason')})")


def restart(d: Daemon) -> None:
    """`POST /restart` on a ready server, then wait for it to be ready again."""
    before = count(d.events(), "server_ready")
    r = httpx.post(f"{d.api}/restart", json={"reason": "harm bench", "diagnose": False}, timeout=10, trust_env=False)
    if r.status_code >= 300:
        raise RuntimeError(f"/restart answered {r.status_code}: {r.text[:200]}")
    d.wait_events(lambda ev: count(ev, "server_ready") > before, 60, "ready after the restart")


@contextlib.contextmanager
def strangers(*argvs: Sequence[str]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes the daemon did not start (at the bench's own nice 0); always ended here, by pid."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for argv in argvs:
            procs.append(
                subprocess.Popen(
                    list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)


def with_port(s: Settings, port: int) -> Settings:
    return s.model_copy(update={"server": s.server.model_copy(update={"port": port})})


# ---- a. another daemon's server -------------------------------------------------------------------


def other_daemon() -> Outcome:
    """The several-servers recipe with `[server] port` forgotten: the second daemon starts beside a
    first one that serves; the first one's server must live on, and record no incident."""
    wa, wb = workdir("harm-daemon-a"), workdir("harm-daemon-b")
    sa = sim_settings(wa, "ok", tp=1)
    sb = with_port(sim_settings(wb, "ok", tp=1), sa.server.port)
    with Daemon(sa, wa) as a:
        pid = a.wait(ready, 60, "the first daemon ready").get("pid")
        with Daemon(sb, wb) as b:
            decided = ("launch_refused", "leftovers_stopped", "server_launched", "spawn_failed")
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and b.proc is not None and b.proc.poll() is None:
                if any(e.get("event") in decided for e in b.events()):
                    break
                time.sleep(0.2)
            time.sleep(3 * W.poll_s + 1.0)  # the first daemon's next polls see what was done
            st = a.status() or {}
            ev_b = [str(e.get("event")) for e in b.events() if e.get("event") in decided]
            if b.proc is not None and b.proc.poll() is not None:
                ev_b.append(f"exited {b.proc.returncode}")
        exited = [str(e.get("cause")) for e in a.events() if e.get("event") == "incident"]
    harm = int(st.get("pid") != pid or bool(exited))
    what = f"second daemon: {', '.join(sorted(set(ev_b))) or 'did nothing in 40 s'}"
    return Outcome(harm, f"{what}; first daemon's server {'replaced/stopped' if harm else 'untouched'}"
                   + (f" (incidents {', '.join(exited)})" if exited else ""))  # fmt: skip


# ---- b. a user process with a similar name ---------------------------------------------------------


def similar_names() -> Outcome:
    """Two user processes that look like SGLang's, running before the daemon starts; one start and
    one `POST /restart` (each runs the clean slate): both must be alive at the end."""
    wd = workdir("harm-names")
    s = sim_settings(wd, "ok", tp=1)
    titled = ["bash", "-c", 'exec -a "sglang::scheduler_TP0" sleep 600']
    launcher = [PY, "-c", "import time; time.sleep(600)", "-m", "sglang.launch_server", "--port", str(s.server.port)]
    with strangers(titled, launcher) as procs:
        time.sleep(0.3)
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a stranger exited before the daemon started")
        with Daemon(s, wd) as d:
            d.wait(ready, 60, "ready")
            restart(d)
        died = [p.pid for p in procs if p.poll() is not None]
    return Outcome(len(died), f"{len(died)} of 2 lookalikes died" + (f" (pids {died})" if died else ""))


# ---- c. another program's shared memory ------------------------------------------------------------

_MAPPER = (
    "import mmap, os, sys, time\n"
    "path = os.path.join(sys.argv[1], f'sgl_shm_mq_{os.getpid()}_5eed')\n"
    "f = open(path, 'w+b'); f.truncate(4096); m = mmap.mmap(f.fileno(), 4096)\n"
    "print(path, flush=True); time.sleep(600)\n"
)


def foreign_shm() -> Outcome:
    """In the daemon's shm dir: a `psm_<hex>` written by a program that has exited (Python's default
    shared-memory name) and a pid-named SGLang-like segment mapped by a live unrelated process."""
    wd = workdir("harm-shm")
    shm = wd / "shm"
    shm.mkdir()
    psm = shm / "psm_3f2a9c1d"
    subprocess.run([PY, "-c", f"open({str(psm)!r}, 'wb').write(bytes(4096))"], check=True, timeout=30)
    s = sim_settings(wd, "ok", tp=1, env={"SGLANG_SIM_SHM_DIR": str(shm)}, restart={"shm_dir": str(shm)})
    mapper = subprocess.Popen([PY, "-c", _MAPPER, str(shm)], stdout=subprocess.PIPE, text=True)
    try:
        assert mapper.stdout is not None
        mapped = Path(mapper.stdout.readline().strip())
        if not mapped.exists():
            raise RuntimeError("the mapping process did not create its segment")
        with Daemon(s, wd) as d:
            d.wait(ready, 60, "ready")
            restart(d)
        gone = [p.name for p in (psm, mapped) if not p.exists()]
    finally:
        mapper.kill()
        mapper.wait(10)
    return Outcome(len(gone), f"{len(gone)} of 2 foreign segments deleted" + (f" ({', '.join(gone)})" if gone else ""))


# ---- d. a launch that fits -------------------------------------------------------------------------


def small_strangers() -> Outcome:
    """A 1 MiB holder and a 2.5 GiB notebook-like process on the simulated 141 GiB GPU: the launch fits."""
    wd = workdir("harm-gpu")
    nvml = wd / "nvml.json"
    with strangers(["sleep", "600"], [PY, "-c", "import time; time.sleep(600)"]) as (tiny, notebook):
        holders = {str(tiny.pid): 2**20, str(notebook.pid): int(2.5 * 2**30)}
        nvml.write_text(f'{{"devices": [{{"uuid": "GPU-harm", "processes": {_json(holders)}}}]}}')
        s = sim_settings(wd, "ok", tp=1, env={"SGLANG_SIM_GPU_FILE": str(nvml)})
        s = s.model_copy(update={"gpu": GpuSettings(source="simulator", file=str(nvml))})
        with Daemon(s, wd) as d:
            with contextlib.suppress(TimeoutError):  # a refusal that never ends: counted below
                d.wait(ready, 30, "ready")
            refused = count(d.events(), "launch_refused")
    return Outcome(refused, f"{refused} launch_refused with 2.5 GiB of 141 GiB held by strangers")


def _json(d: dict[str, int]) -> str:
    return "{" + ", ".join(f'"{k}": {v}' for k, v in d.items()) + "}"


# ---- e. a starved start ----------------------------------------------------------------------------


def starved(k: int) -> Callable[[], Outcome]:
    def trial() -> Outcome:
        """`cpu_count * k` busy loops at nice 0 from the server's launch for 2.5 stall windows, the
        server at nice 19 in a quiet load (2 windows without a log line): starved, not hung."""
        wd = workdir(f"harm-starved-{k}x")
        s = sim_settings(wd, "quiet_load", tp=1, env={"SGLANG_SIM_QUIET_S": str(2 * W.startup_stall_s)})
        niced = ("nice", "-n", "19", PY, "-m", "supervisor.simulator")
        s = s.model_copy(update={"server": s.server.model_copy(update={"command": niced})})
        hogs = (os.cpu_count() or 1) * k
        hog_s = 2.5 * W.startup_stall_s
        with Daemon(s, wd) as d:
            d.wait_events(lambda ev: count(ev, "server_launched") >= 1, 60, "the launch")
            with strangers(*[["sh", "-c", "while :; do :; done"]] * hogs):
                time.sleep(hog_s)
            st = d.wait(settled, 120, "ready after the hogs")
            stalls = hang_incidents(d.events())
        never_ready(st, stalls)
        return Outcome(
            len(stalls),
            f"{hogs} hogs for {hog_s:g} s; {len(stalls)} hang incident(s){' ' + ','.join(stalls) if stalls else ''};"
            f" ended {st.get('state')} on {st.get('rung')}",
        )

    return trial


# ---- f. compiling and loading --------------------------------------------------------------------------


def slow_start(
    scenario: str, env: dict[str, str], what: str, watchdog: dict[str, float] | None = None
) -> Callable[[], Outcome]:
    def trial() -> Outcome:
        wd = workdir(f"harm-{scenario}")
        with Daemon(sim_settings(wd, scenario, tp=1, env=env, watchdog=watchdog), wd) as d:
            st = d.wait(settled, 180, "ready")
            stalls = hang_incidents(d.events())
        never_ready(st, stalls)
        return Outcome(len(stalls), f"{what}; {len(stalls)} hang incident(s); ended {st.get('state')}")

    return trial


# ---- g. slow probes ------------------------------------------------------------------------------------


def slow_health() -> Outcome:
    """`/health` answers in 0.75 x the probe's timeout, under light traffic, for 4 serving windows."""
    wd = workdir("harm-slow-health")
    latency = 0.75 * W.health_timeout_s
    s = sim_settings(wd, "ok", tp=1, env={"SGLANG_SIM_HEALTH_LATENCY_S": str(latency)})
    with Daemon(s, wd) as d:
        d.wait(ready, 60, "ready")
        with Traffic(s.server.port, concurrency=1, seconds=4 * W.serving_stall_s + 5):
            time.sleep(4 * W.serving_stall_s)
        ev = d.events()
    n = len(hang_incidents(ev)) + max(0, count(ev, "server_launched") - 1)
    return Outcome(n, f"/health {latency:g} s (timeout {W.health_timeout_s:g} s); {n} incident(s) or restart(s)")


def late_daemon() -> Outcome:
    """The daemon itself held up (SIGSTOP for 2 serving windows, then SIGCONT) beside a healthy server."""
    wd = workdir("harm-late-daemon")
    s = sim_settings(wd, "ok", tp=1)
    held = 2 * W.serving_stall_s
    with Daemon(s, wd) as d:
        d.wait(ready, 60, "ready")
        os.kill(d.pid, signal.SIGSTOP)
        try:
            time.sleep(held)
        finally:
            os.kill(d.pid, signal.SIGCONT)
        time.sleep(2 * W.serving_stall_s)
        ev = d.events()
    n = len(hang_incidents(ev)) + max(0, count(ev, "server_launched") - 1)
    return Outcome(n, f"daemon stopped {held:g} s; {n} incident(s) or restart(s) after it resumed")


# ---- h. learned windows (issue 36) ---------------------------------------------------------------------

# The outage benchmark's windows (bench/outage.py), which judge its deadlock on a known model in seconds:
# `startup_stall_s` 20 s is the ceiling, a learned window 5 x the longest quiet of a good start, floor 3 s.
LEARNED_CEILING_S = 20.0
LEARNED = LearnedSettings(multiple=5.0, floor_s=3.0)
GOOD_STARTS = 2


def known_then_slow(scenario: str, good: dict[str, str], slow: dict[str, str], what: str) -> Callable[[], Outcome]:
    """Two good starts of one model and rung (the learned book), then a start of the same model and
    rung, slower but progressing: it must come up without a hang verdict. The trial also proves that
    a learned window (not the configured ceiling) was in force during the slow start, else it would
    prove nothing."""

    def trial() -> Outcome:
        wd = workdir(f"harm-learned-{scenario}")
        watchdog = {"startup_stall_s": LEARNED_CEILING_S, "cpu_only_stall_s": 5 * LEARNED_CEILING_S}

        def settings(env: dict[str, str]) -> Settings:
            pace = float(env.pop("PACE", W.pace))
            w = dataclasses.replace(W, pace=pace)
            s = sim_settings(wd, scenario, w=w, tp=1, env=env, watchdog=watchdog)
            return s.model_copy(update={"learned": LEARNED})

        for _ in range(GOOD_STARTS):
            with Daemon(settings(dict(good)), wd) as d:
                d.wait(ready, 120, "a good start")
        seen: list[dict[str, Any]] = []

        def watch(st: dict[str, Any]) -> bool:
            if st.get("state") == "starting" and isinstance(st.get("stall_window"), dict):
                seen.append(st["stall_window"])
            return settled(st)

        with Daemon(settings(dict(slow)), wd) as d:
            st = d.wait(watch, 300, "the slow start ready")
            stalls = hang_incidents(d.events())
        never_ready(st, stalls)
        learned = [w for w in seen if w.get("source") in ("learned", "floor")]
        if not learned:
            raise RuntimeError(f"no learned window was in force during the slow start: {seen[-1:] or 'none seen'}")
        tightest = min(learned, key=lambda w: float(w["window_s"]))
        return Outcome(
            len(stalls),
            f"{what}; learned windows in force down to {float(tightest['window_s']):g} s ({tightest['phase']}, "
            f"{tightest['source']}); {len(stalls)} hang incident(s); ended {st.get('state')}",
        )

    return trial


# ---- the table -------------------------------------------------------------------------------------------


def rows() -> list[list[Row]]:
    """Groups run one after the other; a group's rows run at once, except the starved ones, which
    must have the CPU to themselves (anything else beside them would be starved too)."""
    f = W.startup_stall_s
    return [
        [
            Row("a. kill another daemon's server", "two daemons, one [server] port", other_daemon),
            Row("b. kill a user process with a similar name", "sglang::scheduler_TP0, sglang.launch_server",
                similar_names),
            Row("c. delete another program's shared memory", "psm_<hex>, sgl_shm_mq_<live pid>_<hex>", foreign_shm),
            Row("d. refuse a launch that fits", "1 MiB + 2.5 GiB strangers on GPU 0", small_strangers),
        ],
        [
            # A compile moves only the CPU: it is held to `cpu_only_stall_s`, which ships at 5x the
            # stall window (900 s against 180 s); the row keeps that ratio, so a compile of three
            # windows is a slow start, not a busy hang.
            Row("f. judge a slow start as hung", "long_compile", slow_start(
                "long_compile", {"SGLANG_SIM_COMPILE_S": str(3 * f)},
                f"a silent {3 * f:g} s compile (cpu_only_stall_s {5 * f:g})", {"cpu_only_stall_s": 5 * f})),
            Row("f. judge a slow start as hung", "slow_load", slow_start(
                "slow_load", {"SGLANG_SIM_SHARD_S": str(1.5 * f)}, f"a shard every {1.5 * f:g} s")),
            Row("f. judge a slow start as hung", "quiet_load", slow_start(
                "quiet_load", {"SGLANG_SIM_QUIET_S": str(3 * f)}, f"{3 * f:g} s without a log line")),
            Row("g. restart a healthy server for slow probes", "slow /health", slow_health),
            Row("g. restart a healthy server for slow probes", "daemon loop held up", late_daemon),
        ],
        [
            # Learned windows (issue 36): a start of a known model, slower than every good start but
            # progressing, under the windows that judge the outage benchmark's deadlock in seconds.
            Row("h. judge a slow start of a known model as hung", "3x slower start (pace 3x)", known_then_slow(
                "ok", {}, {"PACE": str(3 * W.pace)}, f"pace {3 * W.pace:g} after {GOOD_STARTS} starts at {W.pace:g}")),
            Row("h. judge a slow start of a known model as hung", "5x slower start (pace 5x)", known_then_slow(
                "ok", {}, {"PACE": str(5 * W.pace)}, f"pace {5 * W.pace:g} after {GOOD_STARTS} starts at {W.pace:g}")),
            Row("h. judge a slow start of a known model as hung", "quiet_load 3x the learned", known_then_slow(
                "quiet_load", {"SGLANG_SIM_QUIET_S": "2"}, {"SGLANG_SIM_QUIET_S": "6"},
                "6 s without a log line after starts with 2 s")),
            Row("h. judge a slow start of a known model as hung", "long_compile 3x the learned", known_then_slow(
                "long_compile", {"SGLANG_SIM_COMPILE_S": "3"}, {"SGLANG_SIM_COMPILE_S": "9"},
                "a silent 9 s compile after starts with 3 s")),
        ],
        [Row("e. judge a starved start as hung", f"{k}x cores of CPU hogs", starved(k)) for k in OVERSUBSCRIPTION],
    ]  # fmt: skip


def starving(group: Sequence[Row]) -> bool:
    """The starved-start rows run one at a time, with nothing else of the bench beside them."""
    return any(r.act.startswith("e.") for r in group)


def _first_note(notes: Sequence[str], limit: int = 220) -> str:
    """The first trial's note whole (cut at a word where too long) and how many trials said otherwise:
    every trial's note joined and cut at a fixed width ended mid-sentence."""
    if not notes:
        return "-"
    first = notes[0] if len(notes[0]) <= limit else notes[0][:limit].rsplit(" ", 1)[0] + " ..."
    return first + (f" (+{len(notes) - 1} other note(s) in the saved results)" if len(notes) > 1 else "")


def render(done: Sequence[Row], trials: int, *, rerendered: bool = False, only: str = "") -> str:
    body = []
    for r in done:
        note = _first_note(r.notes)
        if r.errors:
            note = f"ERROR {r.errors[0][:160]}" + (f"; {note}" if r.notes else "")
        body.append([r.act, r.scenario, r.trials, r.harms if r.trials else "-", note])
    intro = (
        f"Windows: {W.describe()}. {trials} trial(s) per row on {os.cpu_count()} cores. A harm is one act the "
        "daemon must never commit: a server or process it does not own stopped, a segment it cannot prove "
        "its own deleted, a launch that fits refused, a starved or slow start judged hung, a healthy server "
        "restarted. Target: 0 in every row; `-` (ERROR): the scenario could not be run."
        + (" Rendered again (`--render`) from the results the last run saved." if rerendered else "")
        + (
            f" Rows h: `startup_stall_s` {LEARNED_CEILING_S:g} s as the ceiling, learned windows {LEARNED.multiple:g} x"
            f" the longest quiet interval of a phase on {GOOD_STARTS} good starts, floor {LEARNED.floor_s:g} s"
            " (bench/outage.py's, whose table gives the time its deadlock on a known model is judged in);"
            " the note names the"
            " tightest learned window that was in force during the slow start."
            if any(r.act.startswith("h.") for r in done)
            else ""
        )
    )
    title = "Harm: what the daemon must never do"
    if only:  # a run of some rows alone keeps its own section: the full table above is not rewritten
        title = f"Harm, rows {', '.join(only)} alone"
    text = header(title, "harm", intro)
    text = text.replace("bench.run_all --only harm", f"bench.harm --only {only}" if only else "bench.harm")
    return text + "\n" + table(["act", "scenario", "trials", "harms", "note"], body) + "\n"


def saved(doc: dict[str, Any]) -> Row:
    def not_rerun() -> Outcome:
        raise RuntimeError("a saved row is not run again")

    row = Row(str(doc["act"]), str(doc["scenario"]), not_rerun, int(doc["trials"]), int(doc["harms"]))
    row.notes, row.errors, row.seconds = list(doc["notes"]), list(doc["errors"]), float(doc["seconds"])
    return row


def rerender(*, no_write: bool) -> int:
    docs = load_result("harm")
    if not isinstance(docs, list) or not docs:
        print("no saved results (results/harm.json): run `python -m bench.harm` first", file=sys.stderr)
        return 2
    done = sorted((saved(d) for d in docs), key=lambda r: r.act[0])
    text = render(done, max(r.trials for r in done), rerendered=True)
    if no_write:
        print(text, flush=True)
    else:
        publish("harm", text)
    return 0 if all(r.trials and r.harms == 0 and not r.errors for r in done) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.harm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="one trial per row (about 4 minutes on 2 cores)")
    p.add_argument("--trials", type=int, default=3, help="trials per row without --quick (default 3)")
    p.add_argument("--only", default="", help="run only the rows whose act starts with these letters, e.g. 'ab'")
    p.add_argument("--no-write", action="store_true", help="print the table; leave docs/BENCHMARKS.md alone")
    p.add_argument("--render", action="store_true", help="run nothing: write the section again from the saved results")
    args = p.parse_args(argv)
    trials = 1 if args.quick else max(1, args.trials)
    if args.render:
        return rerender(no_write=args.no_write)
    done: list[Row] = []
    for group in rows():
        chosen = [r for r in group if not args.only or r.act[0] in args.only]
        run_rows(chosen, trials, parallel=not starving(chosen))
        done += chosen
        for r in chosen:
            print(f"harm {r.act} [{r.scenario}]: {r.doc()}", flush=True)
    done.sort(key=lambda r: r.act[0])  # the table in the order; the starved rows ran last
    save_result(f"harm-{args.only}" if args.only else "harm", [r.doc() for r in done])
    text = render(done, trials, only=args.only)
    if args.no_write:
        print(text, flush=True)
    else:
        publish(f"harm-{args.only}" if args.only else "harm", text)
    return 0 if all(r.trials and r.harms == 0 and not r.errors for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
