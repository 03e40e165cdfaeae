"""How long `make test` takes: each step's wall time, CPU time and test counts (issue 25, "a faster suite").

The target: `make test` (ruff, mypy --strict, the whole suite) under 5 minutes on 2 cores with no test
dropped, and `make unit` (the tier without `integration` tests) under a minute. The steps run as
`make` runs them, through the same targets, so the figures are the ones a contributor or CI sees.
`--serial` adds the whole suite in one process (`pytest -n 0`), the before figure, ~20 minutes.

    .venv/bin/python -m bench.suite_time                  # prints the table, writes docs/BENCHMARKS.md
    .venv/bin/python -m bench.suite_time --workers 6 --serial --no-write
"""

from __future__ import annotations

import argparse
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.report import machine, stamp, table, write_section

ROOT = Path(__file__).resolve().parents[1]
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]
    in_make_test: bool  # one of the steps `make test` runs, one after the other


@dataclass(frozen=True)
class Timed:
    step: Step
    wall_s: float
    cpu_s: float  # user + system of the step's reaped processes (pytest workers, daemons, simulators)
    code: int
    counts: dict[str, int]


def steps(workers: int, unit_workers: int, serial: bool) -> list[Step]:
    make = ("make", "-s", f"WORKERS={workers}", f"UNIT_WORKERS={unit_workers}")
    out = [
        Step("lint (ruff)", (*make, "lint"), True),
        Step("typecheck (mypy --strict)", (*make, "typecheck"), True),
        Step(f"whole suite, {workers} workers (make suite)", (*make, "suite"), True),
        Step(f"unit tier, {unit_workers} workers (make unit)", (*make, "unit"), False),
    ]
    if serial:
        serial_make = ("make", "-s", "WORKERS=0", "suite")
        out.append(Step("whole suite, one process (before)", serial_make, False))
    return out


def counts(text: str) -> dict[str, int]:
    """pytest's last summary line, e.g. `1330 passed, 9 skipped in 250.1s` -> {"passed": 1330, ...}."""
    lines = [ln for ln in text.splitlines() if re.search(r"\b(passed|failed|error)", ln) and " in " in ln]
    if not lines:
        return {}
    return {kind.rstrip("s") if kind.startswith("error") else kind: int(n) for n, kind in COUNTS.findall(lines[-1])}


def run(step: Step) -> Timed:
    if step.argv[-1] in ("lint", "typecheck"):  # as on a fresh CI machine: no cache from an earlier run
        for cache in (".ruff_cache", ".mypy_cache"):
            shutil.rmtree(ROOT / cache, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(step.argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
    return Timed(step, wall, cpu, proc.returncode, counts(proc.stdout))


def collected() -> int:
    """How many tests the suite holds (the count that must not go down)."""
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "pytest"), "--collect-only", "-q"], cwd=ROOT, capture_output=True, text=True
    )
    m = re.search(r"(\d+) tests? collected", proc.stdout)
    return int(m.group(1)) if m else -1


def report(results: list[Timed], total_tests: int, workers: int) -> str:
    rows: list[list[object]] = []
    for r in results:
        c = r.counts
        tests = f"{c.get('passed', 0)} passed, {c.get('skipped', 0)} skipped, {c.get('failed', 0)} failed" if c else "-"
        rows.append([r.step.name, r.wall_s, r.cpu_s, tests, "ok" if r.code == 0 else f"exit {r.code}"])
    gate = [r for r in results if r.step.in_make_test]
    total = sum(r.wall_s for r in gate)
    rows.append([f"make test (lint + typecheck + suite, {workers} workers)", total, sum(r.cpu_s for r in gate), "", ""])
    return "\n".join(
        [
            "## Suite time: `make test` and `make unit` (issue 25)",
            "",
            f"Measured {stamp()} on {machine()}. {total_tests} tests collected. The machine is shared with "
            "other engineers' test runs, so wall times carry their load; CPU time is this run's own.",
            "ruff and mypy run without their caches, as on a fresh CI machine. "
            "Reproduce: `.venv/bin/python -m bench.suite_time` (`--serial` adds the one-process run; "
            "`--workers N` sets `make suite`'s workers).",
            "",
            table(["step", "wall s", "cpu s", "tests", "outcome"], rows),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--unit-workers", type=int, default=2)
    p.add_argument("--serial", action="store_true", help="also run the whole suite in one process")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    total_tests = collected()
    results = []
    for step in steps(a.workers, a.unit_workers, a.serial):
        print(f"running {step.name}: {' '.join(step.argv)}", file=sys.stderr, flush=True)
        results.append(run(step))
    body = report(results, total_tests, a.workers)
    print(body)
    if not a.no_write:
        write_section("suite_time", body)
    return 0 if all(r.code == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
