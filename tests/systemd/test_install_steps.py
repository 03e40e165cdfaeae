"""systemd/README.md's install steps, followed literally, as root, then checked as the unprivileged
service user of "Running as a dedicated user" (through setpriv, as CI runs as root).

Only the paths move: /etc/sglang-supervisor into a scratch root, the installed console script to
this checkout's, and the user `sglang` to numeric ids nobody uses (so no account is created). The
one step a person does by hand, editing config.toml, is done here with the edits the README asks
for: the server's command and the token file's place.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "systemd" / "README.md"
UID = GID = 64917  # no account: numeric ids are enough for chown, chgrp and setpriv
CLI = Path(sys.executable).with_name("sglang-supervisor")
# The server's program as config.toml names it after the edit step: one every user may run.
SERVER_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), "/bin/sh")

pytestmark = [
    pytest.mark.integration,  # runs the install's shell steps and the CLI as root and as the user
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("setpriv") is None,
        reason="needs root and setpriv (util-linux) to act as the service user",
    ),
]


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)


def block(marker: str) -> str:
    found = [b for b in shell_blocks(README.read_text()) if marker in b]
    assert len(found) == 1, f"one ```sh block of systemd/README.md should contain {marker!r}"
    return found[0]


def localize(script: str, root: Path) -> str:
    """The README's commands with this test's paths and ids; every command line kept as written."""
    lines = [ln for ln in script.splitlines() if not ln.startswith("useradd ")]  # the ids stand in for it
    text = "\n".join(lines) + "\n"
    text = text.replace("/opt/sglang-supervisor/bin/sglang-supervisor", str(CLI))
    text = text.replace("/etc/sglang-supervisor", f"{root}/etc/sglang-supervisor")
    text = re.sub(r"\bchown sglang:", f"chown {UID}:{GID}", text)
    text = re.sub(r"\bchgrp sglang\b", f"chgrp {GID}", text)
    text = text.replace("--reuid sglang --regid sglang", f"--reuid {UID} --regid {GID}")
    assert "sglang " not in text.replace("sglang-supervisor", ""), text  # every use of the account replaced
    return text


def sh(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _as_user(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid", str(UID), "--regid", str(GID), "--clear-groups", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def root() -> Iterator[Path]:
    if _as_user(str(CLI), "--version").returncode != 0:
        pytest.skip(f"this checkout ({REPO}) is not readable by other users, so the service user cannot run it")
    # Not pytest's tmp_path: its parents are 0700 root, which the service user cannot traverse.
    path = Path(tempfile.mkdtemp(prefix="sglang-install-", dir="/tmp"))
    path.chmod(0o755)
    (path / "etc").mkdir(mode=0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def edit_config(root: Path) -> None:
    """The README's "Edit config.toml" step: a server command that exists here, the token's place."""
    cfg = root / "etc" / "sglang-supervisor" / "config.toml"
    text = cfg.read_text()
    text = re.sub(r"(?m)^command = \[.*?\]$", f'command = ["{SERVER_PYTHON}", "-m", "sglang.launch_server"]', text)
    text = text.replace('"/etc/sglang-supervisor/token"', f'"{root}/etc/sglang-supervisor/token"')
    cfg.write_text(text)  # in place: owner, group and mode stay what the steps made them


def test_the_dedicated_user_install_works_as_written(root: Path) -> None:
    step2 = sh(localize(block("# 2. Configuration"), root))
    assert step2.returncode == 0, step2.stderr
    edit_config(root)
    etc = root / "etc" / "sglang-supervisor"
    assert (etc.stat().st_mode & 0o777, (etc / "token").stat().st_mode & 0o777) == (0o750, 0o600)

    user = sh(localize(block("useradd "), root))
    out = user.stdout + user.stderr
    assert user.returncode == 0, out
    assert "error:" not in out and "config OK" in out, out
    assert "Permission denied" not in out, out
    # It really ran as the service user, who reads the config through the group and owns the token.
    assert (etc.stat().st_gid, (etc / "config.toml").stat().st_gid) == (GID, GID)
    assert (etc / "token").stat().st_uid == UID


def test_without_the_group_the_service_user_cannot_read_the_config(root: Path) -> None:
    """What the steps fix: /etc/sglang-supervisor is 0750 root:root after step 2 alone."""
    assert sh(localize(block("# 2. Configuration"), root)).returncode == 0
    edit_config(root)
    cfg = root / "etc" / "sglang-supervisor" / "config.toml"
    check = _as_user(str(CLI), "check-config", "--config", str(cfg), "--no-sglang")
    assert check.returncode == 1
    assert "Permission denied" in check.stderr
