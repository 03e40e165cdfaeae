"""`check-config` says the `[slate] gpu_strangers` policy in force, and warns of a stranger on the
server's GPUs (a real process, listed by the simulated GPU) only when the first launch would not go
ahead beside it, with the numbers."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.checkconfig.argcheck import check_rungs
from supervisor.config.settings import settings_from_mapping

GIB = 2**30


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def checked(tmp_path: Path, pid: int, held: int, **slate: object) -> str:
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"devices": [{"uuid": "GPU-a", "mem_total": 141 * GIB, "processes": {pid: held}}]}))
    s = settings_from_mapping(
        {
            "server": {"command": [sys.executable], "args": {"mem-fraction-static": 0.3}},
            "gpu": {"source": "simulator", "file": str(nvml)},
            "slate": slate,
        }
    )
    out = io.StringIO()
    check_rungs(s, validate=False, out=out, env={"PATH": "/usr/bin:/bin"})
    return out.getvalue()


def test_a_stranger_that_fits_is_no_warning_and_the_policy_is_said(tmp_path: Path, stranger) -> None:  # type: ignore[no-untyped-def]
    text = checked(tmp_path, stranger.pid, int(2.5 * GIB))
    assert 'slate: gpu_strangers = "launch"' in text
    assert "slate.gpu_strangers" not in text and f"pid {stranger.pid}" not in text


def test_a_stranger_leaving_too_little_is_warned_with_the_numbers(tmp_path: Path, stranger) -> None:  # type: ignore[no-untyped-def]
    text = checked(tmp_path, stranger.pid, 138 * GIB)
    assert "warning: slate.gpu_strangers: the launch of rung base would wait now: the launch does not fit" in text
    assert "GPU 0: 3.0 GiB free of 141 GiB, the rung needs 42.3 GiB (mem-fraction-static 0.3)" in text


@pytest.mark.parametrize(("policy", "act"), [("wait", "would wait"), ("refuse", "would fail")])
def test_the_strict_policies_warn_of_any_stranger(tmp_path: Path, stranger, policy: str, act: str) -> None:  # type: ignore[no-untyped-def]
    text = checked(tmp_path, stranger.pid, 2**20, gpu_strangers=policy)
    assert f'slate: gpu_strangers = "{policy}"' in text
    assert f"the launch of rung base {act} now" in text and f"pid {stranger.pid}" in text and "1 MiB" in text
