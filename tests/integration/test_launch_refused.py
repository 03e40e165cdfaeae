"""A launch that cannot start at all (a missing interpreter, permission denied) is a configuration
failure: the running daemon goes to `failed` at once with the reason, without walking the ladder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from supervisor.config.settings import Settings

pytestmark = pytest.mark.integration


def with_command(s: Settings, program: Path) -> Settings:
    return s.model_copy(update={"server": s.server.model_copy(update={"command": (str(program),)})})


def events(s: Settings) -> list[str]:
    lines = (Path(s.paths.state_dir) / "events.jsonl").read_text().splitlines()
    return [json.loads(x)["event"] for x in lines]


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("interpreter", "its interpreter (the #! line, or the Python a venv links to) is missing"),
        ("not_executable", "is not executable by uid"),
        ("venv_link", "-> "),
    ],
)
async def test_a_launch_that_cannot_exec_is_failed_at_once(daemon, sim, tmp_path: Path, case: str, words: str) -> None:  # type: ignore[no-untyped-def]
    program = tmp_path / "bin" / "python3"
    program.parent.mkdir()
    if case == "interpreter":  # a venv whose base Python is gone, or a script's #! naming nothing
        program.write_text("#!/nonexistent/python3.11\nprint('never')\n")
        program.chmod(0o755)
    elif case == "not_executable":
        program.write_text("#!/bin/sh\nexit 0\n")
        program.chmod(0o644)
    else:  # the venv's python links to an interpreter that is not there (another user's home)
        program.symlink_to(tmp_path / "root-only" / "python3.11")
    s = with_command(sim("ok", fallback=[{"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}]), program)
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.state == "failed", 20, "failed")
    if case == "venv_link":
        words = f"-> {tmp_path / 'root-only' / 'python3.11'}"
    assert words in snap.reason and "configuration:" in snap.reason, snap.reason
    assert snap.rung == "base" and snap.restarts == 0  # the ladder was not walked: every rung runs this program
    assert snap.last_incident is not None and words in snap.last_incident.detail
    names = events(s)
    assert names.count("spawn_failed") == 1 and "ladder_decision" not in names
    assert os.path.lexists(program)
