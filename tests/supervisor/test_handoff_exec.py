"""The handoff's re-exec: the same command line in the same process, or exit 75 when the exec fails."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from supervisor import cli
from supervisor.common import sigmask
from supervisor.common.exitcodes import EXIT_HANDOFF


def test_reexec_runs_the_same_command_line_with_the_signals_held(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str]]] = []

    def fake_execv(path: str, argv: list[str]) -> None:
        calls.append((path, argv))
        held = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert held >= sigmask.HELD  # a signal arriving during the exec waits for the new image
        raise OSError(2, "No such file or directory")

    monkeypatch.setattr(os, "execv", fake_execv)
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-m", "supervisor", "run", "--config", "/etc/c.toml"])
    try:
        assert cli.reexec() == EXIT_HANDOFF == 75  # the exec failed: systemd restarts it instead
    finally:
        sigmask.release()
    assert calls == [(sys.executable, [sys.executable, "-m", "supervisor", "run", "--config", "/etc/c.toml"])]
