"""`make demo` (the README's first command) runs the demo with --no-keep: it tells its story to the
end and leaves nothing in the temporary directory. The recipe is read from the Makefile and run as
make would run it, with TMPDIR pointed at an empty directory of the test's."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def demo_recipe() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    m = re.search(r"^demo:.*\n\t(.+)$", text, re.M)
    assert m, "no demo target in the Makefile"
    return shlex.split(m[1])


def test_the_recipe_is_the_demo_until_recovered_without_keeping() -> None:
    argv = demo_recipe()
    assert argv[:2] == ["$(VENV)/bin/sglang-supervisor", "demo"]
    assert "--until-recovered" in argv
    # --no-keep before $(ARGS), so `make demo ARGS=--keep` can still keep it (the last flag wins).
    assert "--no-keep" in argv and argv[-1] == "$(ARGS)" and argv.index("--no-keep") < argv.index("$(ARGS)")


def test_make_demo_leaves_nothing_in_tmp(tmp_path: Path) -> None:
    argv = [a for a in demo_recipe() if a != "$(ARGS)"]
    argv = [sys.executable, "-m", "supervisor", *argv[1:]]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp)}, check=False
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^final: state=stopped rung=no-cuda-graph restarts=1 incidents=1", out, re.M), out[-2000:]
    assert "Hang class: idle_deadlock" in out  # the evidence was shown before it was deleted
    m = re.search(r"^deleted (\S+) \(run with --keep", out, re.M)
    assert m and Path(m[1]).parent == tmp, out[-1000:]
    assert list(tmp.iterdir()) == []
