"""The outage: incident to serving again, in its parts, per case, with caches cold and warm (issue 36).

Cases: a start-up deadlock (`deadlock_after_load`), a serving stall under 3 clients (`serving_stall`),
a crash (`crash_after_ready`), each a one-off fault (`SGLANG_SIM_FAULT_ONCE`), and an Xid (Xid 31 in the
simulated NVML's file, then SIGKILL of scheduler rank 1 once ready: tests/integration/test_gpu_xid.py):
the relaunch of the same rung serves. `cold`: a machine this daemon never started the model on (fresh state
directory, `[caches] pin = false`: no kernel cache survives a launch, no learned window). `warm`:
the same model was started once before on this host (one good start in the same state directory:
its compile is in the pinned cache and its quiet intervals in `launches.json`). The simulator's
first compile takes COMPILE_S cold and 5 % of it from the cache (docs/SIMULATOR.md).

The parts come from the daemon's own journal event `outage` (the same figures as
`sglang_supervisor_outage_seconds`); `onset -> ready` is measured from the simulator's onset record
(the Xid: from the moment the benchmark wrote it).
Restart settings as shipped (backoff_initial_s 1, hung_stop_grace_s 1), evidence as shipped (py-spy
with native frames, gdb on a hang). Run: `.venv/bin/python -m bench.outage` (or `bench.recovery --outage`);
`--script day` runs the fault script instead (bench/faultscript.py, issue 49).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    Daemon,
    OnsetWatcher,
    Traffic,
    W,
    header,
    parse_ts,
    publish,
    save_result,
    sim_settings,
    workdir,
)
from bench.report import REPORT, table
from supervisor.config.fast import CachesSettings, LearnedSettings
from supervisor.config.settings import RestartSettings, Settings

COMPILE_S = 5.0  # the simulator's first compilation, cold
CONFIGURED_STALL_S = 20.0  # [watchdog] startup_stall_s of these runs (production: 180)
LEARNED = LearnedSettings(multiple=5.0, floor_s=3.0)  # production floor: 20 s
CASES: dict[str, tuple[str, bool]] = {  # case -> (simulator scenario, under traffic)
    "start-up deadlock": ("deadlock_after_load", False),
    "serving stall": ("serving_stall", True),
    "crash": ("crash_after_ready", False),
    "xid": ("ok", False),  # the fault is the benchmark's: an Xid in the GPU file, then the rank it killed
}
XID_CASE = "xid"
XID = 31  # illegal memory access: an application's Xid, the daemon relaunches (a reset-class one fails the rung)
DAEMON_TARGET_S = 5.0


@dataclass
class OutageStory:
    case: str
    caches: str
    parts: dict[str, float] = field(default_factory=dict)
    total_s: float | None = None
    daemon_s: float | None = None
    onset_to_ready_s: float | None = None
    window: str = ""
    cache_state: str = ""
    relaunch_graph_s: float | None = None
    relaunch_ready_s: float | None = None
    error: str = ""


def _settings(wd: Path, scenario: str, warm: bool, env: dict[str, str], gpu_file: Path | None = None) -> Settings:
    s = sim_settings(
        wd,
        scenario,
        env={"SGLANG_SIM_PREFILL_COMPILE_S": str(COMPILE_S), **env},
        watchdog={"startup_stall_s": CONFIGURED_STALL_S, "cpu_only_stall_s": 2 * CONFIGURED_STALL_S},
        restart={"retries_per_rung": 1, "stop_grace_s": W.stop_grace_s, "release_timeout_s": W.release_timeout_s},
        diagnostics={"native": True, "gdb": "on_hang"},
        gpu_file=gpu_file,
    )
    shipped = RestartSettings()
    restart = s.restart.model_copy(
        update={"backoff_initial_s": shipped.backoff_initial_s, "hung_stop_grace_s": shipped.hung_stop_grace_s}
    )
    return s.model_copy(update={"learned": LEARNED, "caches": CachesSettings(pin=warm), "restart": restart})


def _warm_up(wd: Path, gpu_file: Path | None) -> str:
    """One good start of the same model and rung in this state directory; "" or the error."""
    d = Daemon(_settings(wd, "ok", True, {}, gpu_file), wd)
    try:
        with d:
            d.wait(lambda x: x["state"] == "ready", 90, "the warm-up start")
    except (TimeoutError, RuntimeError) as err:
        return f"warm-up: {err}"
    return ""


def write_gpu_file(path: Path, xids: list[tuple[int, int]]) -> None:
    """The simulated NVML's file (supervisor/simulator/gpu/nvml.py, events.py): two GPUs and the
    append-only `xid_events` (gpu, xid), replaced atomically."""
    devices = [{"uuid": "GPU-aaaa"}, {"uuid": "GPU-bbbb"}]
    doc = {"devices": devices, "xid_events": [{"gpu": g, "xid": x} for g, x in xids]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def inject_xid(d: Daemon, gpu_file: Path) -> float:
    """Xid XID on GPU 0, then SIGKILL of scheduler rank 1 once the daemon has read the Xid (the driver
    reports the fault and the context dies with it); the onset (wall time of the Xid)."""
    status = d.status() or {}
    rank1 = next(p["pid"] for p in status.get("processes") or [] if p.get("role") == "scheduler" and p.get("rank") == 1)
    onset = time.time()
    write_gpu_file(gpu_file, [(0, XID)])
    d.wait(lambda x: any(v.get("xid") == XID for v in x.get("gpu_xids") or []), 10, "the Xid in /status")
    os.kill(int(rank1), signal.SIGKILL)
    return onset


def story(case: str, warm: bool) -> OutageStory:
    scenario, traffic = CASES[case]
    wd = workdir(f"outage-{scenario}-{'warm' if warm else 'cold'}")
    st = OutageStory(case, "warm" if warm else "cold")
    gpu_file = wd / "nvml.json" if case == XID_CASE else None
    if gpu_file is not None:
        write_gpu_file(gpu_file, [])
    if warm and (err := _warm_up(wd, gpu_file)):
        st.error = err
        return st
    onset_file = wd / "onset.json"
    env = {"SGLANG_SIM_ONSET_FILE": str(onset_file), "SGLANG_SIM_FAULT_ONCE": "1"}
    s = _settings(wd, scenario, warm, env, gpu_file)
    d = Daemon(s, wd)
    xid_onset: float | None = None
    with OnsetWatcher(onset_file) as watcher:
        try:
            with d:
                d.wait(lambda x: x["state"] == "ready", 90, "first ready")
                if gpu_file is not None:
                    xid_onset = inject_xid(d, gpu_file)
                with Traffic(s.server.port) if traffic else contextlib.nullcontext():
                    d.wait_events(lambda ev: any(e.get("event") == "outage" for e in ev), 150, "the outage")
        except (TimeoutError, RuntimeError, StopIteration) as err:
            st.error = str(err) or type(err).__name__
    ev = d.events()
    _facts(st, ev, watcher.onsets[0].wall if watcher.onsets else xid_onset)
    if gpu_file is not None and not st.error:
        st.error = _xid_named(ev)
    return st


def _xid_named(ev: list[dict[str, Any]]) -> str:
    """ "" when the incident names the Xid and a relaunch follows it, else what is missing."""
    incident = next((e for e in ev if e.get("event") == "incident"), None)
    if incident is None or not any(x.get("xid") == XID for x in incident.get("xids") or []):
        return f"the incident names no Xid {XID}"
    if [e.get("after_gpu_fault") for e in ev if e.get("event") == "launch_timeline"][-1:] != [True]:
        return "no relaunch after the GPU fault"
    return ""


def _facts(st: OutageStory, ev: list[dict[str, Any]], onset_wall: float | None) -> None:
    outage = next((e for e in ev if e.get("event") == "outage"), None)
    if outage is None:
        st.error = st.error or "no outage event"
        return
    st.parts = {k: float(v) for k, v in dict(outage["parts"]).items()}
    st.total_s, st.daemon_s = float(outage["total_s"]), float(outage["daemon_s"])
    stall = next((e for e in ev if e.get("event") == "state_changed" and e.get("new") == "hung"), None)
    st.window = str(stall["reason"])[:90] if stall is not None else "-"
    timelines = [e for e in ev if e.get("event") == "launch_timeline"]
    if timelines:
        last = timelines[-1]
        cache = last.get("cache") or {}
        st.cache_state = str(cache.get("state", "-"))
        st.relaunch_graph_s = (last.get("phases") or {}).get("graph_capture")
        st.relaunch_ready_s = last.get("time_to_ready_s")
    if onset_wall is not None:
        st.onset_to_ready_s = round(parse_ts(outage["ts"]) - onset_wall, 3)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


@dataclass(frozen=True)
class KeptRow:
    """A row of the published table that this run did not measure (`--case`): its cells as written."""

    case: str
    caches: str
    cells: list[str]
    measured: str


KEPT_NOTE = re.compile(r"Rows kept from an earlier run \(`--case`\), measured (.+? UTC on [^:]+?): ([^.]+)\.")


def published_rows(path: Path | None = None) -> list[KeptRow]:
    """The rows of the published Outage section (docs/BENCHMARKS.md unless `path`), each with when it
    was measured (the section's own stamp, or the kept-rows note that names its case)."""
    try:
        text = (path or REPORT).read_text()
    except OSError:
        return []
    m = re.search(r"<!-- section:outage -->(.*?)<!-- /section:outage -->", text, re.S)
    if m is None:
        return []
    section = m.group(1)
    stamp = re.search(r"^Measured (\d{4}-\d\d-\d\d \d\d:\d\d UTC on [^;]+)", section, re.M)
    when = {case: note[1] for note in KEPT_NOTE.finditer(section) for case in note[2].split(", ")}
    rows: list[KeptRow] = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        label = re.fullmatch(r"(.+) \((cold|warm)\)", cells[0]) if line.startswith("|") else None
        if label is not None and label[1] in CASES:
            measured = when.get(label[1], stamp[1] if stamp else "at an unknown time")
            rows.append(KeptRow(label[1], label[2], cells, measured))
    return rows


def render(stories: list[OutageStory], kept: list[KeptRow] | None = None) -> str:
    kept = kept or []
    rows = [
        [
            f"{x.case} ({x.caches})",
            _f(x.parts.get("detection")),
            _f(x.parts.get("evidence")),
            _f(x.parts.get("stop_release")),
            _f(x.parts.get("backoff")),
            _f(x.parts.get("relaunch")),
            _f(x.total_s),
            _f(x.onset_to_ready_s),
            _f(x.daemon_s) + ("" if x.daemon_s is None or x.daemon_s < DAEMON_TARGET_S else " (over 5 s)"),
            f"{x.cache_state or '-'}, graphs {_f(x.relaunch_graph_s)} s",
            (x.error[:60] or "-"),
        ]
        for x in stories
    ] + [k.cells for k in kept]
    order = [f"{c} ({w})" for c in CASES for w in ("cold", "warm")]
    rows.sort(key=lambda r: order.index(r[0]) if r[0] in order else len(order))
    tbl = table(
        [
            "case",
            "detection",
            "evidence",
            "stop + release",
            "backoff",
            "relaunch",
            "outage",
            "onset -> ready",
            "daemon's share",
            "relaunch cache",
            "error",
        ],
        rows,
    )
    intro = (
        f"Configured `startup_stall_s` {CONFIGURED_STALL_S:g} s, learned windows {LEARNED.multiple:g} x the longest "
        f"quiet interval, floor {LEARNED.floor_s:g} s; poll {W.poll_s:g} s; simulator pace {W.pace:g}; the first "
        f"compile {COMPILE_S:g} s cold (a fresh machine: no cache kept, no learned window) and 5 % of it warm (the "
        "model started once before on this host). Seconds; `outage` is the daemon's own "
        '`sglang_supervisor_outage_seconds{part="total"}` (detection + evidence + stop and release + backoff + '
        "relaunch), `onset -> ready` the simulator's fault onset to the daemon's ready; `daemon's share` is the "
        "verdict to the relaunch's spawn (evidence + stop + backoff), target under 5 s. `relaunch cache`: the "
        "relaunch's kernel cache and its graph-capture phase (where the compile happens). ModelExpress "
        "(ai-dynamo) for scale: DeepSeek-V4-Pro on 8 GPUs ready in 8 min 01 s cold, 7 min with weights from a "
        "peer, 1 min 44 s with weights from a peer plus the JIT kernel caches. "
        f"The Xid: Xid {XID} on GPU 0 in the simulated NVML's event file, then SIGKILL of scheduler rank 1 "
        "(the driver's context death) once ready; its `onset -> ready` runs from the Xid."
    )
    load = os.getloadavg()[0]
    intro += f"\n\nLoad average {load:.1f} on {os.cpu_count()} cores when this table was rendered."
    by_stamp: dict[str, list[str]] = {}
    for k in kept:
        if k.case not in by_stamp.setdefault(k.measured, []):
            by_stamp[k.measured].append(k.case)
    for when, cases in by_stamp.items():
        intro += f" Rows kept from an earlier run (`--case`), measured {when}: {', '.join(cases)}."
    return header("Outage: incident to serving again, in its parts", "outage", intro) + "\n" + tbl + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a == "--script" or a.startswith("--script=") for a in args):
        from bench import faultscript  # the fault script (issue 49): its own options

        return faultscript.main(args)
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--case",
        choices=sorted(CASES),
        action="append",
        help="only these cases (default: all); the other cases' rows of the published table stay",
    )
    p.add_argument("--no-write", action="store_true", help="print, do not write docs/BENCHMARKS.md")
    p.add_argument("--script", choices=["day"], help="the fault script instead (bench/faultscript.py, issue 49)")
    a = p.parse_args(argv)
    cases = a.case or list(CASES)
    # --case keeps the other cases' last results (the published rows) in the table
    kept = [k for k in published_rows() if k.case not in cases] if a.case else []
    stories: list[OutageStory] = []
    for case in cases:
        for warm in (False, True):
            st = story(case, warm)
            print(f"outage {case} {st.caches}: {st.__dict__}", flush=True)
            stories.append(st)
    save_result("outage", [x.__dict__ for x in stories])
    body = render(stories, kept)
    if a.no_write:
        print(body)
    else:
        publish("outage", body)
    return 0 if all(not x.error and x.total_s is not None for x in stories) else 1


if __name__ == "__main__":
    raise SystemExit(main())
