"""bench.suite_time: what it reads from pytest's summary and which steps make up `make test`."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def st(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT))  # `python -m bench.suite_time` runs from the repository root
    return importlib.import_module("bench.suite_time")


def test_counts_read_the_last_summary_line(st: ModuleType) -> None:
    out = "....F.\n= 2 failed, 1294 passed, 9 skipped in 325.01s (0:05:25) =\n"
    assert st.counts(out) == {"failed": 2, "passed": 1294, "skipped": 9}
    assert st.counts("1 error, 3 passed, 4 deselected in 1.0s") == {"error": 1, "passed": 3, "deselected": 4}
    assert st.counts("no summary here (make lint)") == {}


def test_make_test_is_lint_typecheck_and_the_parallel_suite(st: ModuleType) -> None:
    plan = st.steps(workers=6, unit_workers=2, serial=True)
    gate = [s.argv[-1] for s in plan if s.in_make_test]
    assert gate == ["lint", "typecheck", "suite"]
    assert any("WORKERS=6" in s.argv for s in plan if s.argv[-1] == "suite" and s.in_make_test)
    (serial,) = [s for s in plan if not s.in_make_test and "WORKERS=0" in s.argv]
    assert serial.argv[-1] == "suite"


def test_the_table_sums_only_what_make_test_runs(st: ModuleType) -> None:
    def timed(name: str, gate: bool, wall: float) -> object:
        return st.Timed(st.Step(name, ("make", name), gate), wall, wall / 2, 0, {"passed": 1})

    body = st.report([timed("lint", True, 5.0), timed("suite", True, 200.0), timed("unit", False, 40.0)], 1344, 6)
    total = next(line for line in body.splitlines() if line.startswith("| make test"))
    assert "205.0" in total and "1344 tests collected" in body
