"""Run the CPU benchmark suite and write docs/BENCHMARKS.md and the README's summary table.

    .venv/bin/python -m bench.run_all                 # the default parts, about 12 minutes on 2 cores
    .venv/bin/python -m bench.run_all --only overhead # one part (repeatable)
    .venv/bin/python -m bench.run_all --with hostile --with multinode   # the default parts and these

Parts run in order; `peers` reads the detection and recovery results of the same run (from
$SGLANG_BENCH_OUT, default /tmp/sglang-supervisor-bench). A part that fails is reported and the
suite goes on. Two parts are opt-in, run only when named (`--only` or `--with`), because each
would add minutes to the default run: `hostile` (issue 33's attacks on the API, about 4 minutes)
`multinode` (ten trials of a two-node group, roughly 10 minutes), `group_recovery` (issue 54's
group recovery cases, about 8 minutes a run of each) and `poll_cost` (the daemon's own CPU and RSS,
about 9 minutes). The README's `## Benchmarks`
section (the file's last) is rewritten from the results of the latest run of each part.
"""

from __future__ import annotations

import argparse
import importlib
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import OUT, ROOT, W, load_result, median, met, percentile, publish
from bench.report import machine, stamp, table

PARTS = ("detection", "false_positives", "evidence", "recovery", "outage", "overhead", "peers", "adoption", "readers")
OPT_IN = ("hostile", "multinode", "group_recovery", "poll_cost")  # run only when named: each adds minutes
README = ROOT / "README.md"
README_HEADING = "## Benchmarks"


def run_part(name: str) -> int:
    main: Callable[[list[str]], int] = importlib.import_module(f"bench.{name}").main
    try:
        return main([])
    except Exception:
        traceback.print_exc()
        return 2


# ---- the README table -------------------------------------------------------------------------


def _detection_rows(det: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    dl = next((r for r in det if r["scenario"] == "deadlock_after_load"), None)
    if dl and dl["delays_s"]:
        rows.append(
            [
                "Silent deadlock after load (0 % CPU, no port, no log): onset to verdict",
                f"{median(dl['delays_s']):.1f} s median, {max(dl['delays_s']):.1f} s max ({len(dl['delays_s'])} runs)",
                f"window {dl['window_s']:g} s + 2 polls = {dl['target_s']:g} s: {met(dl['ok'])}",
            ]
        )
    ok = sum(bool(r["ok"]) for r in det)
    worst = max(det, key=lambda r: (max(r["delays_s"]) - r["target_s"]) if r["delays_s"] else 1e9)
    rows.append(
        [
            f"All {len(det)} fault scenarios (hangs, crashes, dead rank, health, serving stall, EAGLE regression)",
            f"{ok}/{len(det)} within their window + 2 polls; worst: `{worst['scenario']}` "
            + (f"{max(worst['delays_s']):.1f} s of {worst['target_s']:g} s" if worst["delays_s"] else "no verdict"),
            met(ok == len(det)),
        ]
    )
    return rows


def _fp_row(fp: list[dict[str, Any]]) -> list[str]:
    restarts = sum(int(r["restarts"]) for r in fp)
    incidents = sum(int(r["incidents"]) for r in fp)
    what = ", ".join(f"{r['case'].split(' ')[0]} {r['windows']:g} windows" for r in fp)
    return [
        f"False positives ({what})",
        f"{restarts} restarts, {incidents} incidents",
        f"0: {met(all(r['ok'] for r in fp))}",
    ]


def _evidence_rows(ev: list[dict[str, Any]]) -> list[list[str]]:
    def pick(procs: int, mode: str) -> dict[str, Any] | None:
        return next((r for r in ev if r["processes"] == procs and r["mode"] == mode), None)

    rows = []
    nat, gdb = pick(9, "py-spy --native"), pick(9, "py-spy --native + gdb")
    if nat:
        rows.append(
            [
                "Evidence bundle, 9 processes, py-spy with native frames, no gdb",
                f"{median(nat['durations_s']):.2f} s median, {max(nat['durations_s']):.2f} s max",
                f"< 3 s: {met(max(nat['durations_s']) < 3)}",
            ]
        )
    if gdb:
        rows.append(
            [
                "Evidence bundle, 9 processes, native frames + gdb backtraces",
                f"{median(gdb['durations_s']):.2f} s median",
                "no target",
            ]
        )
    return rows


def _recovery_row(rec: dict[str, Any]) -> list[str] | None:
    xs = [x["total_s"] for x in rec.get("ladder", {}).get("deadlock_after_load", []) if x.get("total_s") is not None]
    if not xs:
        return None
    return [
        "Deadlock onset to ready on the fallback rung (detect, evidence with gdb, stop, relaunch)",
        f"{median(xs):.1f} s median",
        "no target",
    ]


def _overhead_rows(ov: dict[str, Any]) -> list[list[str]]:
    rows = []
    for u in ov["usage"]:
        why = " (a ready, idle 9-process tree)"
        rows.append(
            [
                f"Daemon CPU, 9-process tree, poll {u['poll_s']:g} s",
                f"{u['cpu_percent']:.1f} % of a core{why}",
                f"< 1 % at a 2 s poll: {met(u['cpu_percent'] < 1)}" if u["poll_s"] == 2 else "-",
            ]
        )
    rss = max(max(u["rss_mb"]) for u in ov["usage"])
    rows.append(["Daemon RSS", f"{rss:.0f} MB", f"< 100 MB: {met(rss < 100)}"])
    idle = percentile(ov["latency"]["idle"]["/status"], 99)
    cap = percentile(ov["latency"]["capture"]["/status"], 99)
    rows.append(
        [
            "`/status` p99, 4 concurrent clients: idle / during a gdb capture",
            f"{idle:.1f} ms / {cap:.1f} ms",
            f"< 20 ms: {met(idle < 20)} / < 100 ms: {met(cap < 100)}",
        ]
    )
    return rows


def _peer_rows(peers: dict[str, Any]) -> list[list[str]]:
    obs, loops = peers.get("observe", {}), peers.get("loops", {})
    noticed = [k for k, o in obs.items() if o.get("restarts_after_onset", 0) > 0]
    esc = loops.get("escape_group", {})
    rows = [
        [
            f"supervisord 4.3 on {', '.join(f'`{k}`' for k in obs)}",
            f"noticed {len(noticed)} of {len(obs)}; after `escape_group` its restart left the port held "
            f"({esc.get('bind_errors', '?')} `address already in use`), then `{esc.get('state', '?')}`",
            "comparison",
        ]
    ]
    dl, ss = obs.get("deadlock_after_load", {}), obs.get("serving_stall", {})
    if "policy" in dl and "policy" in ss:
        when = dl.get("policy_from_onset_s")
        rows.append(
            [
                "Kubernetes probes (policy evaluation, 25-min startup budget, liveness on `/health`)",
                f"deadlock after load: restart ~{when:.0f} s after onset; serving stall: "
                + ("never" if ss["policy"]["restart_at"] is None else f"{ss['policy_from_onset_s']:.0f} s"),
                "comparison",
            ]
        )
    return rows


def _multinode_row(mn: list[dict[str, Any]]) -> list[str] | None:
    """The group's two rank faults and the trials that must cost no restart (bench/multinode.py)."""
    ok = [r for r in mn if not r.get("error")]

    def of(fault: str) -> list[dict[str, Any]]:
        return [r for r in ok if r["fault"] == fault]

    def med(fault: str, key: str) -> str:
        xs = [r[key] for r in of(fault) if r.get(key) is not None]
        return f"{median(xs):.1f} s" if xs else "-"

    kill, stop = of("rank_sigkill"), of("rank_sigstop")
    if not kill or not stop:
        return None
    # Trials whose servers are relaunched by design (a rank fault, a node that never joins, a node lost
    # and back, a leader killed mid-restart) are judged by bench/multinode.py's own end check.
    relaunching = (
        "rank_sigkill", "rank_sigstop", "never_joins", "config_mismatch", "node_loss_return",
        "leader_killed_at_stop", "leader_killed_at_launch",
    )  # fmt: skip
    quiet = [r for r in ok if r["fault"] not in relaunching]
    restarts = sum(sum(r["restarts"]) for r in quiet)
    bundles = all(r.get("bundles") == 2 for r in kill + stop)
    mismatch = of("config_mismatch")
    refused = bool(mismatch) and all(r["restarts"][1:] == [-1] for r in mismatch)
    result = (
        f"group verdict {med('rank_sigkill', 'verdict_s')} (`{kill[0]['cause']}`) / "
        f"{med('rank_sigstop', 'verdict_s')} (`{stop[0]['cause']}`) (windows {W.startup_stall_s:g} s), "
        + ("both nodes' bundles, " if bundles else "")
        + f"group ready again {med('rank_sigkill', 'ready_s')} / {med('rank_sigstop', 'ready_s')}"
    )
    if quiet:
        result += (
            "; member or leader daemon SIGKILLed, member API partitioned, workers 15 or 60 s late, "
            f"leader 15 s late: {restarts} restarts"
        )
    if mismatch:
        result += "; a member with another `tp-size`: " + ("refused, never launched" if refused else "NOT refused")
    return [
        "Multi-node group, two simulated nodes (`bench/multinode.py`): worker rank SIGKILL / SIGSTOP under load",
        result,
        f"0 restarts: {met(bool(quiet) and restarts == 0 and (refused or not mismatch))}",
    ]


def readme_table() -> str:
    rows: list[list[str]] = []
    det, fp, ev = load_result("detection"), load_result("false_positives"), load_result("evidence")
    rec, ov, peers = load_result("recovery"), load_result("overhead"), load_result("peers")
    mn = load_result("multinode")
    if det:
        rows += _detection_rows(det)
    if fp:
        rows.append(_fp_row(fp))
    if ev:
        rows += _evidence_rows(ev)
    if rec and (row := _recovery_row(rec)) is not None:
        rows.append(row)
    if ov:
        rows += _overhead_rows(ov)
    if peers:
        rows += _peer_rows(peers)
    if mn and (row := _multinode_row(mn)) is not None:
        rows.append(row)
    return table(["measure", "result", "target (issue 9)"], rows)


def write_readme(tbl: str, path: Path = README) -> None:
    """Replace the README's last section, `## Benchmarks`, or append it."""
    text = path.read_text()
    body = (
        f"{README_HEADING}\n\n"
        f"Measured on the simulator on a shared CPU machine ({machine()}), {stamp()}, with short windows "
        f"(poll {W.poll_s:g} s, stall {W.startup_stall_s:g} s); every figure, the method and the GPU "
        "measurements are in [docs/BENCHMARKS.md](docs/BENCHMARKS.md). Reproduce with "
        "`.venv/bin/python -m bench.run_all` (the multi-node row: `--only multinode`, which the default "
        "run leaves out).\n\n"
        f"{tbl}\n"
    )
    at = text.rfind(f"\n{README_HEADING}\n")
    text = text.rstrip("\n") + "\n\n" + body if at < 0 else text[: at + 1] + body
    path.write_text(text)


def suite_section(codes: dict[str, int], minutes: float) -> str:
    rows = [[p, "ok" if c == 0 else ("targets missed" if c == 1 else "error")] for p, c in codes.items()]
    return (
        "## CPU suite: how it was run\n\n"
        f"`.venv/bin/python -m bench.run_all` on {machine()}, {stamp()}, {minutes:.1f} minutes. Everything runs "
        "against the built-in SGLang simulator (real processes, ports, HTTP, signals, py-spy and gdb; no GPU), "
        f"with short windows so the suite fits in minutes: {W.describe()}. Production defaults are minutes "
        "long (docs/CONFIGURATION.md): detection scales with the window, the rest does not. The machine is "
        "shared with other test runs. Raw results: `$SGLANG_BENCH_OUT/results/*.json` (default "
        f"`{OUT}`).\n\n" + table(["part", "outcome"], rows) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--only", action="append", choices=PARTS + OPT_IN, help="run only this part (repeatable; opt-in parts too)"
    )
    p.add_argument(
        "--with",
        dest="also",
        action="append",
        choices=OPT_IN,
        help="also run this opt-in part after the default ones (repeatable)",
    )
    p.add_argument("--no-readme", action="store_true", help="leave README.md alone")
    p.add_argument("--readme-only", action="store_true", help="only rewrite the README table from saved results")
    a = p.parse_args(argv)
    if a.readme_only:
        write_readme(readme_table())
        print(readme_table())
        return 0
    also = a.also or []
    parts = [x for x in PARTS + OPT_IN if x in a.only] if a.only else [*PARTS, *(x for x in OPT_IN if x in also)]
    t0 = time.monotonic()
    codes = {}
    for name in parts:
        print(f"== {name}", flush=True)
        t = time.monotonic()
        codes[name] = run_part(name)
        print(f"== {name}: exit {codes[name]} in {time.monotonic() - t:.0f} s", flush=True)
    if not a.only:
        publish("suite", suite_section(codes, (time.monotonic() - t0) / 60))
    if not a.no_readme:
        write_readme(readme_table())
    print(readme_table())
    return max(codes.values(), default=0)


if __name__ == "__main__":
    raise SystemExit(main())
