"""`make demo` (README's first command): the demo tells its story and ends by itself, keeps its evidence
and says where it is."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_the_demo_ends_once_recovered_and_keeps_its_evidence() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor", "demo", "--until-recovered", "--duration", "150"],
        capture_output=True,
        text=True,
        timeout=200,
    )
    out = proc.stdout
    m = re.search(r"^state kept in (\S+): bundles in", out, re.M)
    root = Path(m.group(1)) if m else None
    try:
        assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
        assert "Ctrl-C to stop sooner" in out and "(kept)" in out
        assert re.search(r"final: state=stopped rung=no-cuda-graph restarts=1 incidents=1", out), out[-2000:]
        assert root is not None and any((root / "diagnostics").glob("*startup_stall/summary.txt"))
        assert "Hang class: idle_deadlock" in out
        # The demo's GPU is the simulator's, chosen by its config and said so.
        assert re.search(r"^GPU: the simulator's GPU from \S+simulated-gpu.json", out, re.M), out[:2000]
        assert '[gpu]\nsource = "simulator"' in (root / "demo.toml").read_text()
        bundle = next((root / "diagnostics").glob("*startup_stall/summary.json")).read_text()
        assert "GPU-sim-0" in bundle and "GPU-sim-1" in bundle  # the NVML snapshot in the evidence
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def test_the_cross_engine_demo_ends_on_vllm() -> None:
    """`sglang-supervisor demo --cross-engine` (docs/ENGINES.md): both SGLang rungs deadlock, the ladder
    ends on the simulator speaking vLLM, which serves; the journal names each launch's engine."""
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor", "demo", "--cross-engine", "--until-recovered", "--duration", "150"],
        capture_output=True,
        text=True,
        timeout=200,
    )
    out = proc.stdout
    m = re.search(r"^state kept in (\S+): bundles in", out, re.M)
    root = Path(m.group(1)) if m else None
    try:
        assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
        assert re.search(r"final: state=stopped rung=vllm-no-spec restarts=2 incidents=2", out), out[-2000:]
        assert re.search(r"state=ready +rung=vllm-no-spec engine=vllm", out), out[-2000:]
        assert root is not None
        launched = [json.loads(x) for x in (root / "events.jsonl").read_text().splitlines()]
        engines = [(e["rung"], e["engine"]) for e in launched if e["event"] == "server_launched"]
        assert engines == [("base", "sglang"), ("no-cuda-graph", "sglang"), ("vllm-no-spec", "vllm")]
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
