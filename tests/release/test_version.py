"""One version, written once (supervisor/__init__.py), and what a release carries with it: the
package metadata reads it, `--version` prints it, the changelog's newest release is it, the image
tags in the deploy files name it, and the LICENSE is the Apache-2.0 text pyproject declares."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

import pytest

import supervisor

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")  # a final release: no .dev, rc or local part


def test_the_version_is_written_once_and_pyproject_reads_it() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project, "pyproject.toml must not repeat the version"
    assert project["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "supervisor.__version__"}
    m = RELEASE.fullmatch(supervisor.__version__)
    assert m, supervisor.__version__
    assert tuple(int(part) for part in m.groups()) > (0, 1, 0), "0.1.0 was the development version"


@pytest.mark.integration  # runs the CLI
def test_version_flag_prints_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"sglang-supervisor {supervisor.__version__}"


def test_the_changelog_s_newest_release_is_this_version() -> None:
    headings = re.findall(r"^## (\S+)(?: - (\d{4}-\d{2}-\d{2}))?$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    released = [(v, d) for v, d in headings if v != "Unreleased"]
    assert released, headings
    version, date = released[0]
    assert version == supervisor.__version__ and date, released[0]
    assert [h[0] for h in headings].count(version) == 1


def test_image_tags_in_the_deploy_files_and_docs_name_this_version() -> None:
    files = [*ROOT.glob("deploy/**/*.yaml"), ROOT / "deploy/docker/Dockerfile", *ROOT.glob("docs/*.md")]
    tags = {
        (path.name, tag)
        for path in files
        for tag in re.findall(r"sglang-supervisor:([0-9][\w.]*)-sglang", path.read_text())
    }
    assert tags, "no image tag found: the check would pass on nothing"
    stale = {(name, tag) for name, tag in tags if tag != supervisor.__version__}
    assert not stale, f"image tags not at {supervisor.__version__}: {sorted(stale)}"


def test_the_license_is_apache_2_0_as_pyproject_declares() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    assert lines[:2] == ["Apache License", "Version 2.0, January 2004"]
    # The whole text, not a stub: its nine sections and the appendix.
    for n, title in enumerate(["Definitions.", "Grant of Copyright License.", "Grant of Patent License."], 1):
        assert f"{n}. {title}" in text
    assert "9. Accepting Warranty or Additional Liability." in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
