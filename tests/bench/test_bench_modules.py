"""Every benchmark module imports, and every benchmark with a command line answers `--help`, run
the way bench/README.md says (`python -m bench.<name>` from the repository root, no sys.path edits),
so a benchmark broken by a change in the daemon fails here rather than on the GPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
# bench/real/inject goes on the real server's PYTHONPATH and patches SGLang when imported: not a
# bench module (tests/bench/test_real_inject.py checks it).
INJECT = BENCH / "real" / "inject"


def _modules() -> dict[str, Path]:
    paths = [p for p in sorted(BENCH.rglob("*.py")) if INJECT not in p.parents]
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in paths}


MODULES = _modules()
ENTRY_POINTS = [m for m, path in MODULES.items() if "ArgumentParser(" in path.read_text()]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # found from the root, as a user runs it
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


def test_the_bench_package_is_found() -> None:
    assert {"bench", "bench.real", "bench.gpuserver", "bench.run_all", "bench.real.run"} <= set(MODULES)
    assert len(ENTRY_POINTS) >= 20


@pytest.mark.integration  # a fresh interpreter imports every bench module
def test_every_bench_module_imports() -> None:
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\nprint('ok', len(sys.argv) - 1)"
    done = _run("-c", code, *MODULES)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"ok {len(MODULES)}"


@pytest.mark.integration  # an interpreter per benchmark
@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_bench_command_line_answers_help(module: str) -> None:
    done = _run("-m", module, "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage:" in done.stdout


def test_no_bench_module_edits_sys_path_or_imports_daemon_internals() -> None:
    internals = ("loop", "core", "serve", "commands", "handlers", "actions")  # supervisor.daemon's insides
    for path in BENCH.rglob("*.py"):
        if INJECT in path.parents:
            continue
        text = path.read_text()
        assert "sys.path.insert" not in text and "sys.path.append" not in text, path
        assert not any(f"from supervisor.daemon.{m} import" in text for m in internals), path
