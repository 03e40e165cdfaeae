"""`python -m bench.gpu_ranks` in its CPU mode (the lane the lead runs on the H200 with cuda-gdb): eight
real ranks, one capture, the spread between them in the result."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_eight_cpu_ranks_are_captured_with_their_spread(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench.gpu_ranks", "--cpu", "--reps", "1", "--out", str(tmp_path)]
    if shutil.which("gdb") is None:
        argv.append("--no-gdb")
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_ranks.json").read_text())
    (run,) = result["runs"]
    assert run["ranks"] == 8 and run["rank_spread_s"] is not None and 0 <= run["rank_spread_s"] < 5
    assert run["bundle_s"] < 15
    summary = json.loads((Path(run["path"]) / "summary.json").read_text())
    assert summary["sampling"]["ranks_sampled"] == 8
