from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.diagnostics.selfcheck import ptrace_check, self_check


def fake_proc(tmp_path: Path, cap_eff: str, scope: int | None) -> Path:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text(f"Name:\tx\nCapEff:\t{cap_eff}\n")
    if scope is not None:
        yama = tmp_path / "sys" / "kernel" / "yama"
        yama.mkdir(parents=True)
        (yama / "ptrace_scope").write_text(f"{scope}\n")
    return tmp_path


@pytest.mark.parametrize(
    ("cap_eff", "scope", "ok", "words"),
    [
        ("000001ffffffffff", 3, True, "CAP_SYS_PTRACE"),
        ("0000000000080000", 2, True, "CAP_SYS_PTRACE"),  # bit 19 alone
        ("0000000000000000", None, True, "no Yama"),
        ("0000000000000000", 0, True, "ptrace_scope=0"),
        ("0000000000000000", 1, False, "only its descendants"),
        ("0000000000000000", 2, False, "ptrace_scope=2"),
        ("0000000000000000", 3, False, "forbids ptrace"),
    ],
)
def test_ptrace_permission(tmp_path: Path, cap_eff: str, scope: int | None, ok: bool, words: str) -> None:
    check = ptrace_check(fake_proc(tmp_path, cap_eff, scope))
    assert check.name == "ptrace" and check.ok is ok
    assert words in check.detail
    if not ok:
        assert "CAP_SYS_PTRACE" in check.detail  # the fix is named


def test_another_uid_without_the_capability_is_refused(tmp_path: Path) -> None:
    import os

    check = ptrace_check(fake_proc(tmp_path, "0", 0), server_uid=os.geteuid() + 1)
    assert not check.ok and "another uid" in check.detail


def test_missing_tools_are_reported_with_the_fix(tmp_path: Path) -> None:
    checks = {c.name: c for c in self_check(str(tmp_path / "py-spy"), str(tmp_path / "gdb"))}
    assert set(checks) == {"py-spy", "ptrace", "gdb", "cuda-gdb", "pystack"}
    assert not checks["py-spy"].ok and "pip install py-spy" in checks["py-spy"].detail
    assert not checks["gdb"].ok and "apt install gdb" in checks["gdb"].detail


def test_installed_tools_report_their_version() -> None:
    checks = {c.name: c for c in self_check()}
    assert checks["py-spy"].ok and "py-spy" in checks["py-spy"].detail
    if checks["gdb"].ok:
        assert "gdb" in checks["gdb"].detail.lower()


def test_version_line_skips_the_cuda_gdb_wrapper_line() -> None:
    from supervisor.diagnostics.selfcheck import version_line

    text = "exec: /usr/local/cuda/bin/cuda-gdb-python3.12-tui --version\nNVIDIA (R) cuda-gdb 13.0\n"
    assert version_line(text) == "NVIDIA (R) cuda-gdb 13.0"
    assert version_line("") == "version unknown"
