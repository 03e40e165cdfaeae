"""The harm benchmark cannot rot: its rows cover every harmful act of issue 32, a trial that cannot
run is an error (never a 0), the table says so, and one cheap scenario runs end to end through the
real daemon from its command line."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def harm(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT))  # `python -m bench.harm` runs from the repository root
    return importlib.import_module("bench.harm")


def test_every_harmful_act_has_a_row_and_the_starved_start_runs_at_2_4_and_8_times(harm: ModuleType) -> None:
    rows = [r for group in harm.rows() for r in group]
    assert {r.act[0] for r in rows} == set("abcdefgh")
    # issue 36: a known model's slower starts under learned windows (the outage benchmark's)
    assert [r.scenario for r in rows if r.act.startswith("h.")] == [
        "3x slower start (pace 3x)",
        "5x slower start (pace 5x)",
        "quiet_load 3x the learned",
        "long_compile 3x the learned",
    ]
    assert harm.LEARNED.floor_s < harm.LEARNED_CEILING_S  # else no learned window could be in force
    assert [r.scenario for r in rows if r.act.startswith("e.")] == [f"{k}x cores of CPU hogs" for k in (2, 4, 8)]
    for group in harm.rows():  # the starved rows run alone, one after the other
        assert not harm.starving(group) or all(r.act.startswith("e.") for r in group)


def test_harms_are_summed_and_a_trial_that_could_not_run_is_an_error_not_a_zero(harm: ModuleType) -> None:
    results = iter([harm.Outcome(2, "two deleted"), harm.Outcome(0, "none")])
    counted = harm.run_row(harm.Row("c. delete", "shm", lambda: next(results)), trials=2)
    assert (counted.trials, counted.harms, counted.notes) == (2, 2, ["two deleted", "none"])

    def broken() -> object:
        raise TimeoutError("ready: not within 60 s")

    failed = harm.run_row(harm.Row("f. judge", "slow_load", broken), trials=3)
    assert failed.trials == 0 and len(failed.errors) == 3
    text = harm.render([counted, failed], trials=2)
    lines = {line.split("|")[2].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert lines["shm"].split("|")[4].strip() == "2"
    assert "two deleted (+1 other note(s) in the saved results)" in lines["shm"]
    assert lines["slow_load"].split("|")[4].strip() == "-" and "ERROR TimeoutError" in lines["slow_load"]
    assert "## Harm" in text and "python -m bench.harm" in text


def test_render_writes_the_section_again_from_saved_results(harm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    row = harm.run_row(harm.Row("g. restart", "slow /health", lambda: harm.Outcome(1, "one restart")), trials=1)
    published: list[tuple[str, str]] = []
    monkeypatch.setattr(harm, "load_result", lambda name: [row.doc()] if name == "harm" else None)
    monkeypatch.setattr(harm, "publish", lambda part, body: published.append((part, body)))
    assert harm.main(["--render"]) == 1  # a harm was counted: the run is not a pass
    ((part, body),) = published
    assert part == "harm" and "| g. restart" in body and "one restart" in body and "Rendered again" in body
    monkeypatch.setattr(harm, "load_result", lambda name: None)
    assert harm.main(["--render"]) == 2


def test_a_start_that_failed_without_a_verdict_is_no_result(harm: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="never ready"):
        harm.never_ready({"state": "failed", "reason": "internal error"}, [])
    harm.never_ready({"state": "failed"}, ["startup_stall"])  # failed by the verdicts counted: a result
    harm.never_ready({"state": "ready"}, [])


@pytest.mark.integration
def test_the_lookalike_scenario_runs_through_the_daemon(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"SGLANG_BENCH_OUT": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.harm", "--quick", "--only", "b", "--no-write"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    row = next((x for x in done.stdout.splitlines() if x.startswith("| b. ")), "")
    assert row, done.stdout[-2000:] + done.stderr[-2000:]
    cells = [c.strip() for c in row.split("|")]
    assert cells[3] == "1" and cells[4] == "0", row  # one trial, no lookalike killed
    assert "0 of 2 lookalikes died" in row
    assert done.returncode == 0
    assert (tmp_path / "results" / "harm-b.json").exists()  # a partial run keeps the full results as they were
