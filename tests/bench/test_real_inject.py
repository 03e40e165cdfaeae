"""The real recipe's faults (bench/real/inject) patch SGLang's own functions on import, and only when
armed: checked on the CPU against a stand-in package with SGLang's module paths (the GPU runs use
real SGLang 0.5.16; bench/real/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

INJECT = Path(__file__).resolve().parents[2] / "bench" / "real" / "inject"

MODULES = {
    "sglang/srt/model_executor/model_runner.py": (
        "class ModelRunner:\n    def alloc_memory_pool(self): return 'pool'\n    def forward(self): return 'out'\n"
    ),
    "sglang/srt/speculative/eagle_draft_cuda_graph_runner.py": (
        "class EAGLEDraftCudaGraphRunner:\n    def capture_one_shape(self): return 'graph'\n"
    ),
}

PROBE = """
import json
from sglang.srt.model_executor.model_runner import ModelRunner as R
from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner as E
def patched(f):
    return f.__qualname__ != f.__name__ and "_wrap" in f.__qualname__
print(json.dumps({"alloc": patched(R.alloc_memory_pool), "forward": patched(R.forward),
                  "capture": patched(E.capture_one_shape), "forward_result": R().forward()}))
"""


def stand_in(root: Path) -> Path:
    for rel, text in MODULES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if str(parent) != ".":
                (root / parent / "__init__.py").touch()
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("", {"alloc": False, "forward": False, "capture": False}),
        ("kv_deadlock", {"alloc": True, "forward": False, "capture": False}),
        ("illegal_access", {"alloc": False, "forward": True, "capture": False}),
        ("busy_capture", {"alloc": False, "forward": False, "capture": True}),
    ],
)
def test_each_fault_patches_its_own_function_and_only_when_armed(
    tmp_path: Path, fault: str, expected: dict[str, bool]
) -> None:
    pkg = stand_in(tmp_path / "pkg")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REAL_FAULT")}
    # REAL_FAULT_TRIGGER names a file the recipe creates once the server is ready: not yet here.
    env.update(PYTHONPATH=f"{INJECT}{os.pathsep}{pkg}", REAL_FAULT=fault, REAL_FAULT_TRIGGER=str(tmp_path / "later"))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert {k: got[k] for k in expected} == expected
    assert got["forward_result"] == "out"  # illegal_access waits for its trigger: the original runs
