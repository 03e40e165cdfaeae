"""Recovery: fault onset to `ready` on the fallback rung, with the time each step took; and stops of
trees that fight back (children ignoring SIGTERM, a helper that left the session holding the port).

Ladder: the base rung faults unless `--disable-cuda-graph` is given (SGLANG_SIM_UNLESS), the one
fallback rung `no-cuda-graph` gives it. Diagnostics as shipped: py-spy with native frames, gdb on
a hang. Steps come from the journal: verdict, `bundle_written`, `server_stopped` (`stop_s`,
`release_wait_s`), `server_ready` on the fallback rung. `--outage` runs bench/outage.py instead: the
outage in its parts (issue 36) per case, with caches cold and warm.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.common import (
    Daemon,
    OnsetWatcher,
    W,
    header,
    median,
    parse_ts,
    publish,
    save_result,
    sim_settings,
    workdir,
)
from bench.report import table

NO_GRAPH = {"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}
LADDER_SCENARIOS = ("deadlock_after_load", "busy_hang_after_load", "crash_on_load")
VERDICT_STATES = frozenset({"hung", "diagnosing", "restarting"})


@dataclass
class Story:
    scenario: str
    detect_s: float | None = None
    bundle_s: float | None = None
    stop_s: float | None = None
    release_s: float | None = None
    relaunch_ready_s: float | None = None
    total_s: float | None = None
    rung: str = ""
    hang_class: str | None = None
    survivors: list[int] = field(default_factory=list)
    port_free: bool | None = None
    killed: int = 0
    pids_found: int = 0
    left_after_daemon: int = 0
    gpu_check: str = ""
    error: str = ""


def ladder_story(scenario: str) -> Story:
    wd = workdir(f"recovery-{scenario}")
    onset_file = wd / "onset.json"
    s = sim_settings(
        wd,
        scenario,
        env={"SGLANG_SIM_ONSET_FILE": str(onset_file), "SGLANG_SIM_UNLESS": "disable-cuda-graph"},
        fallback=[NO_GRAPH],
        diagnostics={"native": True, "gdb": "on_hang"},
    )
    story = Story(scenario)
    d = Daemon(s, wd)
    with OnsetWatcher(onset_file) as watcher:
        try:
            with d:
                d.wait(lambda x: x["state"] == "ready" and x["rung"] == "no-cuda-graph", 90, "ready on no-cuda-graph")
        except (TimeoutError, RuntimeError) as err:
            story.error = str(err)
    story.left_after_daemon = len(d.leftovers)
    ev = d.events()
    if not watcher.onsets:
        story.error = story.error or "no onset recorded"
        return story
    onset = watcher.onsets[0].wall
    moves = [parse_ts(e["ts"]) for e in ev if e.get("event") == "state_changed" and e.get("new") in VERDICT_STATES]
    verdict = next((t for t in moves if t >= onset - 0.002), None)
    bundle = next((e for e in ev if e.get("event") == "bundle_written"), None)
    stopped = next((e for e in ev if e.get("event") == "server_stopped"), None)
    ready = next((e for e in ev if e.get("event") == "server_ready" and e.get("rung") == "no-cuda-graph"), None)
    incident = next((e for e in ev if e.get("event") == "incident"), None)
    story.detect_s = None if verdict is None else round(verdict - onset, 3)
    story.bundle_s = None if bundle is None else float(bundle["duration_s"])
    if stopped is not None:
        _stop_facts(story, stopped)
    if ready is not None:
        story.relaunch_ready_s = float(ready["time_to_ready_s"])
        story.total_s = round(parse_ts(ready["ts"]) - onset, 3)
        story.rung = str(ready["rung"])
    story.hang_class = None if incident is None else incident.get("hang_class")
    return story


def _stop_facts(story: Story, stopped: dict[str, Any]) -> None:
    story.stop_s = float(stopped["stop_s"])
    story.release_s = float(stopped["release_wait_s"])
    story.survivors = list(stopped["survivors"])
    story.port_free = bool(stopped["port_free"])
    story.killed = len(stopped["killed"])
    story.gpu_check = str(stopped.get("gpu_check", ""))
    story.pids_found = len(stopped["pids_found"])


def restart_story(scenario: str) -> Story:
    """A ready server whose tree fights the stop; `POST /restart`, then ready again."""
    wd = workdir(f"recovery-{scenario}")
    s = sim_settings(wd, scenario)
    story = Story(scenario)
    d = Daemon(s, wd)
    try:
        with d:
            d.wait(lambda x: x["state"] == "ready", 60, "ready")
            r = httpx.post(f"{d.api}/restart", json={"reason": "benchmark"}, timeout=10, trust_env=False)
            if r.status_code != 202:
                story.error = f"/restart answered {r.status_code}: {r.text[:200]}"
                return story
            d.wait_events(
                lambda ev: sum(e.get("event") == "server_ready" for e in ev) >= 2, 60, "ready after the restart"
            )
    except (TimeoutError, RuntimeError) as err:
        story.error = str(err)
    story.left_after_daemon = len(d.leftovers)
    ev = d.events()
    command = next((parse_ts(e["ts"]) for e in ev if e.get("event") == "command" and e.get("kind") == "restart"), None)
    stopped = next((e for e in ev if e.get("event") == "server_stopped"), None)
    readies = [e for e in ev if e.get("event") == "server_ready"]
    if stopped is not None:
        _stop_facts(story, stopped)
    if command is not None and len(readies) >= 2:
        story.total_s = round(parse_ts(readies[1]["ts"]) - command, 3)
        story.relaunch_ready_s = float(readies[1]["time_to_ready_s"])
        story.rung = str(readies[1]["rung"])
    return story


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _med(xs: list[float | None]) -> str:
    vals = [x for x in xs if x is not None]
    if not vals:
        return "-"
    return f"{median(vals):.2f}" if len(vals) == 1 else f"{median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"


def _nvml(stories: list[Story]) -> str:
    checks = {x.gpu_check for x in stories if x.gpu_check}
    return " (no NVML)" if checks == {"unavailable"} else ""


def render(ladder: dict[str, list[Story]], fights: list[Story]) -> str:
    rows = []
    for scenario, stories in ladder.items():
        ok = [x for x in stories if x.total_s is not None]
        rows.append(
            [
                scenario,
                f"{len(ok)}/{len(stories)}",
                _med([x.detect_s for x in stories]),
                _med([x.bundle_s for x in stories]),
                _med([x.stop_s for x in stories]),
                _med([x.release_s for x in stories]) + _nvml(stories),
                _med([x.relaunch_ready_s for x in stories]),
                _med([x.total_s for x in stories]),
                ", ".join(sorted({x.hang_class or "- (exited)" for x in stories})),
                sum(len(x.survivors) for x in stories) + sum(x.left_after_daemon for x in stories),
            ]
        )
    intro = (
        f"Windows: {W.describe()}; backoff 0.2 s. Each run: a fresh daemon, the base rung faults, the daemon "
        "captures evidence (py-spy --native, and gdb on a hang), stops the tree, verifies the release and "
        "relaunches on `no-cuda-graph`. Cells: median (min-max) over the runs, in seconds. `release` is the "
        "bounded wait for NVML to show none of the old pids holding GPU memory: NVML is absent here, so it "
        "returns at once and the journal says `gpu_check: unavailable` (the GPU section measures it on an "
        "H200). The port check is part of `stop`."
    )
    tbl = table(
        [
            "fault",
            "ready on fallback",
            "detect",
            "evidence",
            "stop",
            "release",
            "relaunch -> ready",
            "onset -> ready",
            "hang class",
            "left behind",
        ],
        rows,
    )
    frows = [
        [
            x.scenario,
            f"{x.pids_found}",
            f"{x.killed}",
            _s(x.stop_s),
            "yes" if x.port_free else "no",
            len(x.survivors) + x.left_after_daemon,
            _s(x.total_s),
            x.error[:80] or "-",
        ]
        for x in fights
    ]
    ftbl = table(
        [
            "tree",
            "members found",
            "SIGKILLed after grace",
            "stop s",
            "port free",
            "left behind",
            "restart -> ready s",
            "error",
        ],
        frows,
    )
    fights_intro = (
        f"Stops that fight back, after `POST /restart` on a ready server (stop_grace_s {W.stop_grace_s:g}): "
        "`ignore_sigterm` (every process ignores SIGTERM, so the grace runs out and SIGKILL follows) and "
        "`escape_group` (a helper left the session with `setsid`, re-parented away, still holding the listening "
        "socket; it is found by the daemon's marker variable). `left behind` counts processes alive after the "
        "stop and after the daemon itself was stopped."
    )
    return (
        header("Recovery: fault onset to ready on the fallback rung", "recovery", intro)
        + "\n"
        + tbl
        + "\n\n"
        + fights_intro
        + "\n\n"
        + ftbl
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--outage", action="store_true", help="the outage in its parts instead (bench/outage.py)")
    a = p.parse_args(argv)
    if a.outage:
        from bench import outage

        return outage.main([])
    ladder: dict[str, list[Story]] = {}
    for scenario in LADDER_SCENARIOS:
        for _ in range(a.reps):
            st = ladder_story(scenario)
            print(f"recovery {scenario}: {st.__dict__}", flush=True)
            ladder.setdefault(scenario, []).append(st)
    fights = []
    for scenario in ("ignore_sigterm", "escape_group"):
        st = restart_story(scenario)
        print(f"recovery {scenario}: {st.__dict__}", flush=True)
        fights.append(st)
    save_result(
        "recovery",
        {"ladder": {k: [x.__dict__ for x in v] for k, v in ladder.items()}, "fights": [x.__dict__ for x in fights]},
    )
    publish("recovery", render(ladder, fights))
    every = [x for v in ladder.values() for x in v] + fights
    return 0 if all(not x.error and x.total_s is not None for x in every) else 1


if __name__ == "__main__":
    raise SystemExit(main())
