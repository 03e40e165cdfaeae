"""check-config warns when SGLang's own --watchdog-timeout would kill the tree before the daemon's
window judges the same hang, naming both keys. Driven through the CLI as an operator runs it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor.cli import main

PY = f'command = ["{sys.executable}", "-m", "sglang.launch_server"]'


def check(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, *extra: str) -> tuple[int, str]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[server]\n{PY}\n{body}\n")
    code = main(["check-config", "--config", str(cfg), "--no-sglang", *extra])
    return code, capsys.readouterr().out


def test_a_short_watchdog_timeout_warns_naming_both_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(
        tmp_path, capsys, '[server.args]\nmodel-path = "/m"\nwatchdog-timeout = 20\n[watchdog]\nserving_stall_s = 60'
    )
    line = next(x for x in out.splitlines() if x.startswith("warning: server.args.watchdog-timeout"))
    assert "20 s is shorter than [watchdog] serving_stall_s = 60 s" in line and "kills its own tree" in line
    assert code == 0  # a warning: the daemon still reads SGLang's dump
    code, _ = check(tmp_path, capsys, '[server.args]\nmodel-path = "/m"\nwatchdog-timeout = 20', "--strict")
    assert code == 1


def test_sglangs_default_against_a_long_window_and_a_rung_that_sets_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = (
        '[server.args]\nmodel-path = "/m"\n[watchdog]\nserving_stall_s = 400\n'
        '[[fallback]]\nname = "short"\nargs = { watchdog-timeout = 30 }\n'
        '[[fallback]]\nname = "long"\nargs = { watchdog-timeout = 1000 }'
    )
    _, out = check(tmp_path, capsys, body)
    warnings = [x for x in out.splitlines() if "watchdog-timeout" in x and x.startswith("warning")]
    assert any(
        x.startswith("warning: server.args.watchdog-timeout") and "300 s (SGLang's default)" in x for x in warnings
    )
    assert any(x.startswith("warning: fallback[0] (short).args.watchdog-timeout") for x in warnings)
    assert not any("(long)" in x for x in warnings)


def test_a_long_enough_watchdog_timeout_is_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(tmp_path, capsys, '[server.args]\nmodel-path = "/m"\nwatchdog-timeout = 600')
    assert code == 0 and "warning" not in out
