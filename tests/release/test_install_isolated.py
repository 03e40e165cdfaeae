"""Issue 53: the install is isolated and its prerequisites are said. The units run the daemon from its
own virtual environment, the install docs put it there, and the image build's smoke script stops at
once, naming runc, when it is asked to use runc and none is installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = "/opt/sglang-supervisor/bin/"


def test_the_units_and_the_install_docs_use_the_daemons_own_venv() -> None:
    for unit in ("sglang-supervisor.service", "sglang-supervisor@.service"):
        text = (REPO / "systemd" / unit).read_text()
        starts = re.findall(r"^ExecStart=(\S+)", text, re.M)
        assert starts and all(s.startswith(VENV) for s in starts), (unit, starts)
    install = (REPO / "systemd" / "README.md").read_text()
    assert "python3 -m venv /opt/sglang-supervisor\n/opt/sglang-supervisor/bin/pip install" in install
    assert "Why its own virtual environment" in install and "supervisord" in install
    readme = (REPO / "README.md").read_text()
    use = readme[readme.index("## Use") :]
    assert use.index("python3 -m venv /opt/sglang-supervisor") < use.index("pip install dist/")


@pytest.mark.skipif(shutil.which("runc") is not None, reason="runc is installed here")
def test_the_image_smoke_stops_at_once_without_runc(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    podman = fake / "podman"
    podman.write_text('#!/bin/sh\necho podman-was-run >> "$0.calls"\n')
    podman.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:/usr/bin:/bin", "PODMAN": "podman --runtime runc", "BASE": "standin"}
    done = subprocess.run(
        ["bash", str(REPO / "tests" / "release" / "image_smoke.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "apt-get install runc" in done.stderr, done.stdout + done.stderr
    calls = fake / "podman.calls"
    assert not calls.exists() or "build" not in calls.read_text()  # nothing was built
    assert "runc" in (REPO / "docs" / "RELEASE.md").read_text().split("## The image")[1].split("```")[0]
