"""The fault script's pure parts (bench/faultscript.py, issue 49): the oracle's ideal per step, the
ratio and the total line, the rows read from a journal, and the server wrapper's choice of fault per
launch (bench/faultserver.py), including the wrapper run as the daemon runs it; no daemon starts."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fs(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT))  # `python -m bench.outage` runs from the repository root
    return importlib.import_module("bench.faultscript")


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT))
    return importlib.import_module("bench.faultserver")


def _step(fs: ModuleType, name: str) -> object:
    return next(s for s in fs.STEPS if s.name == name)


def test_the_oracle_per_step(fs: ModuleType) -> None:
    p = fs.Pieces(stop_s=0.5, launch_s=20.0, to_fault_s=18.0)
    stall, spec = fs.scaled("startup_stall_s"), fs.scaled("spec_window_s")
    assert stall == 3.0 and spec == 3.0  # 180 s and 120 s scaled by 0.01, floored at 3 s
    assert fs.ideal(_step(fs, "transient deadlock"), p) == (stall + 0.5 + 20.0, 1)
    assert fs.ideal(_step(fs, "graph-capture fault"), p) == (stall + 0.5 + 20.0, 1)
    assert fs.ideal(_step(fs, "speculative regression"), p) == (spec + 0.5 + 20.0, 1)
    assert fs.ideal(_step(fs, "xid"), p) == (fs.POLL_S + 0.5 + 20.0, 1)
    assert fs.ideal(_step(fs, "stopped front end"), p) == (fs.health_window_s() + 0.5 + 20.0, 1)
    assert fs.ideal(_step(fs, "daemon restart"), p) == (0.0, 0)
    # a failed promote: stop, the preferred rung up to its fault, detection, stop, straight back
    assert fs.ideal(_step(fs, "promote, cause persists"), p) == (0.5 + 18.0 + stall + 0.5 + 20.0, 2)
    assert fs.ideal(_step(fs, "promote, fixed"), p) == (0.5 + 20.0, 1)
    assert [fs.ideal_launches(s) for s in fs.STEPS] == [1, 1, 1, 1, 1, 0, 2, 1]


def test_every_duration_is_scaled_by_one_factor_or_floored(fs: ModuleType) -> None:
    for name, real in fs.REAL.items():
        assert fs.scaled(name) == round(max(real * fs.SCALE, fs.FLOORS.get(name, 0.0)), 3)
    assert fs.REAL["load"] * fs.SCALE == 15.0  # a 25-minute load in 15 s
    w = fs.windows()
    assert (w.startup_stall_s, w.backoff_initial_s, w.backoff_max_s, w.poll_s) == (3.0, 0.01, 3.0, 0.5)


def test_ratio_and_the_total_line(fs: ModuleType) -> None:
    assert fs.ratio(None, 10.0) is None
    assert fs.ratio(15.0, 10.0) == 1.5
    assert fs.ratio(0.0, 0.0) == 1.0 and fs.ratio(fs.POLL_S, 0.0) == 1.0  # adopted within a poll
    assert fs.ratio(20.0, 0.0) == float("inf")  # a relaunch where adoption was possible
    rows = [fs.Row(i + 1, s.name) for i, s in enumerate(fs.STEPS)]
    for r in rows:
        r.outage_s, r.ideal_s, r.launches, r.ideal_launches = 11.0, 10.0, 1, 1
    rows[5].outage_s, rows[5].ideal_s, rows[5].launches, rows[5].ideal_launches = 0.0, 0.0, 0, 0
    t = fs.totals(rows)
    assert (t.outage_s, t.ideal_s, t.ratio, t.launches, t.ideal_launches) == (77.0, 70.0, 1.1, 7, 7)
    assert t.total_met and t.rows_met
    rows[1].outage_s, rows[1].launches = 25.0, 4  # one row over 2x: the rows' target fails
    t = fs.totals(rows)
    assert t.ratio == round(91.0 / 70.0, 3) and not t.total_met and not t.rows_met
    rows[7].outage_s = None  # a row not measured: neither target is met
    t = fs.totals(rows)
    assert not t.total_met and not t.rows_met


def _ev(kind: str, t: float, **kw: object) -> dict[str, object]:
    import datetime as dt

    ts = dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"ts": ts, "event": kind, **kw}


def test_rows_from_the_journal(fs: ModuleType) -> None:
    t0 = 1_800_000_000.0
    ev = [
        _ev("server_launched", t0, rung="base"),
        _ev("server_ready", t0 + 20, rung="base", time_to_ready_s=20.0),
        _ev("server_stopped", t0 + 30, stop_s=0.4, release_wait_s=0.1),
        _ev("server_launched", t0 + 31, rung="base"),
        _ev("server_stopped", t0 + 55, stop_s=0.4, release_wait_s=0.1),
        _ev("server_launched", t0 + 56, rung="no-cuda-graph"),
        _ev("server_ready", t0 + 74, rung="no-cuda-graph", time_to_ready_s=18.0),
    ]
    assert fs.launch_times(ev) == {"base": 20.0, "no-cuda-graph": 18.0, "*": 19.0}
    assert fs.stop_time(ev) == 0.5
    rows = [fs.Row(i + 1, s.name) for i, s in enumerate(fs.STEPS)]
    rows[1].onset, rows[1].rung_before = t0 + 50, "base"  # the capture hang, 19 s into the restart's launch
    fs.fill(rows, ev, None)
    r = rows[1]
    assert (r.outage_s, r.launches, r.rung_after, r.target) == (24.0, 1, "no-cuda-graph", "no-cuda-graph")
    assert r.ideal_s == round(fs.scaled("startup_stall_s") + 0.5 + 18.0, 3) and r.ideal_launches == 1
    assert rows[0].outage_s is None and rows[0].error == ""  # no onset: not run, not judged
    assert fs._to_fault(ev, t0 + 30, t0 + 50) == 19.0


def test_a_run_reads_back_from_its_saved_result(fs: ModuleType) -> None:
    from dataclasses import asdict

    row = fs.Row(1, "transient deadlock", outage_s=24.0, ideal_s=22.0)
    run = fs.Run("old", "/x/python", "on", [row], wall_s=5.0)
    back = fs.from_json(json.loads(json.dumps(asdict(run))))
    assert back == run
    assert fs.from_json(None) is None
    body = fs.render({("old", "on"): back})
    assert "## Outage: the fault script" in body and "New code: not measured." in body
    assert "--script day" in body and "| 1 transient deadlock" in body
    assert "with `on` triggers" in body and "without triggers" not in body  # only the ladders measured


def test_the_two_ladders_differ_only_in_their_triggers(fs: ModuleType) -> None:
    plain, on = fs.LADDERS["plain"], fs.LADDERS["on"]
    assert (
        [r["name"] for r in plain] == [r["name"] for r in on] == ["smaller-graphs", "no-cuda-graph", "no-spec", "safe"]
    )
    assert all("on" not in r for r in plain)
    assert {r["name"]: r.get("on") for r in on if "on" in r} == {
        "no-cuda-graph": ["cuda_graph_capture"],
        "no-spec": ["spec_regression"],
    }
    for ladder in fs.LADDERS:
        data = fs.config(Path("/tmp/x"), sys.executable, Path("/tmp/x/c.json"), Path("/tmp/x/g.json"), ladder)
        assert data["server"]["command"][1].endswith("bench/faultserver.py")
        assert data["restart"]["start_from"] == "last_good" and data["learned"] == {"enabled": False}


def test_the_wrapper_picks_the_first_rule_that_matches_the_launch(server: ModuleType) -> None:
    control = {
        "rules": [
            {"unless": ["disable-cuda-graph"], "env": {"SGLANG_SIM_SCENARIO": "busy_capture_hang"}},
            {"with": ["speculative-algorithm"], "env": {"SGLANG_SIM_SCENARIO": "low_accept"}},
        ]
    }
    base = ["--model-path", "/m", "--speculative-algorithm", "EAGLE3", "--tp-size", "2"]
    assert server.select_env(control, base) == {"SGLANG_SIM_SCENARIO": "busy_capture_hang"}
    assert server.select_env(control, [*base, "--cuda-graph-max-bs", "8"])["SGLANG_SIM_SCENARIO"] == (
        "busy_capture_hang"
    )
    assert server.select_env(control, [*base, "--disable-cuda-graph"]) == {"SGLANG_SIM_SCENARIO": "low_accept"}
    assert server.select_env(control, ["--speculative-algorithm=EAGLE3", "--disable-cuda-graph"]) == {
        "SGLANG_SIM_SCENARIO": "low_accept"
    }
    assert server.select_env(control, ["--model-path", "/m", "--disable-cuda-graph"]) == {}
    assert server.select_env({}, base) == {}
    assert server.select_env({"rules": "nonsense"}, base) == {}
    assert server.select_env({"rules": [7, {"env": {"A": 1}}]}, base) == {"A": "1"}
    assert server.flags(["-x", "--", "--a=1", "--b", "v"]) == frozenset({"a", "b"})


def test_the_wrapper_reads_a_bad_or_missing_file_as_no_fault(server: ModuleType, tmp_path: Path) -> None:
    assert server.read_control(None) == {}
    assert server.read_control(str(tmp_path / "absent.json")) == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert server.read_control(str(tmp_path / "bad.json")) == {}
    (tmp_path / "list.json").write_text("[1]")
    assert server.read_control(str(tmp_path / "list.json")) == {}


def test_the_wrapper_becomes_the_simulator_with_the_rule_env(tmp_path: Path) -> None:
    """Run as the daemon runs it: a script under some interpreter, execing `-m supervisor.simulator`
    in the same process with the chosen environment (here a stand-in package prints what it got)."""
    pkg = tmp_path / "supervisor" / "simulator"
    pkg.mkdir(parents=True)
    (tmp_path / "supervisor" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'pid': os.getpid(), 'argv': sys.argv[1:], 'scenario': os.environ['SGLANG_SIM_SCENARIO']}))\n"
    )
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"rules": [{"unless": ["disable-cuda-graph"], "env": {"SGLANG_SIM_SCENARIO": "x"}}]}))
    env = {**os.environ, "SGLANG_FAULT_CONTROL": str(control), "SGLANG_SIM_SCENARIO": "ok", "PYTHONPATH": str(tmp_path)}
    script = str(ROOT / "bench" / "faultserver.py")
    for argv, want in ((["--tp-size", "2"], "x"), (["--disable-cuda-graph"], "ok")):
        p = subprocess.Popen([sys.executable, script, *argv], env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        out, _ = p.communicate(timeout=60)
        got = json.loads(out)
        assert (got["pid"], got["argv"], got["scenario"]) == (p.pid, argv, want)
