"""Issue 53: the daemon refuses to start, naming the path, when the `supervisor` package it imports is
not sglang-supervisor's own: supervisord's distribution (also a package named `supervisor`) mixed into
the same directory, or another `supervisor` package first on sys.path. Real `sglang-supervisor run`
processes; a distribution's metadata made as pip writes it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from supervisor.common.exitcodes import EXIT_CONFIG
from supervisor.config.render import dump_toml

pytestmark = pytest.mark.integration
OURS = Path(__file__).resolve().parents[2] / "supervisor"


def fake_supervisord(site: Path, package_dir: Path) -> None:
    """supervisord 4.2.5's dist-info in `site`, its RECORD claiming `package_dir`'s __init__.py."""
    info = site / "supervisor-4.2.5.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: supervisor\nVersion: 4.2.5\n")
    rel = os.path.relpath(package_dir / "__init__.py", site)
    (info / "RECORD").write_text(f"{rel},,\n{os.path.relpath(package_dir / 'supervisord.py', site)},,\n")


def run(sim_settings, tmp_path: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_toml(sim_settings))
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "run", "--config", str(cfg)],
        cwd=tmp_path,  # not the checkout: `python -m` puts the working directory first on sys.path
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_supervisords_files_in_our_package_directory_refuse_the_start(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    fake_supervisord(site, OURS)
    s = sim("ok", tp=1)
    done = run(s, tmp_path, site)
    assert done.returncode == EXIT_CONFIG, done.stdout + done.stderr
    assert "refused to start" in done.stderr and f"`supervisor` at {OURS}" in done.stderr, done.stderr
    assert "supervisor 4.2.5" in done.stderr and "its own virtual environment" in done.stderr
    assert not (Path(s.paths.state_dir) / "events.jsonl").exists()  # nothing started


@pytest.mark.skipif(
    not any((d.metadata["Name"] or "") == "sglang-supervisor" for d in metadata.distributions()),
    reason="sglang-supervisor is not installed here (run from a source tree)",
)
def test_another_supervisor_package_first_on_the_path_refuses_the_start(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    other = tmp_path / "other"
    shutil.copytree(OURS, other / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    s = sim("ok", tp=1)
    done = run(s, tmp_path, other)
    assert done.returncode == EXIT_CONFIG, done.stdout + done.stderr
    assert f"`import supervisor` resolves to {other / 'supervisor'}, not to sglang-supervisor's own" in done.stderr
    assert not (Path(s.paths.state_dir) / "events.jsonl").exists()


def test_the_install_checked_here_is_fine(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from supervisor.common import ownpackage

    assert ownpackage.check() is None
