"""The handoff's re-exec: the same command line in the same process, or exit 75 when the exec fails."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

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


def test_preflight_validates_what_a_start_would_and_starts_nothing(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from simconfig import sim_settings

    from supervisor.config.render import dump_toml
    from supervisor.root.preflight import preflight_argv

    cfg = tmp_path / "c.toml"
    good = dump_toml(sim_settings(tmp_path, "ok"))
    cfg.write_text(good)
    assert cli.main(["run", "--preflight", "--config", str(cfg)]) == 0
    assert not (tmp_path / "state" / "daemon.lock").exists(), "nothing started"
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o644)
    cfg.write_text(good.replace("[api]", f'[api]\ntoken_file = "{token}"', 1))
    assert cli.main(["run", "--preflight", "--config", str(cfg)]) == 2
    assert "readable or writable by group or others" in capsys.readouterr().err
    # The handoff runs the command line it will re-execute, plus --preflight.
    argv = ["/usr/bin/sglang-supervisor", "run", "--config", "/etc/c.toml", "--log-json"]
    assert preflight_argv(Path("/etc/c.toml"), argv) == [sys.executable, *argv[1:], "--preflight"]
    assert preflight_argv(Path("/etc/c.toml"), ["pytest", "-q"])[1:] == [
        "-m",
        "supervisor",
        "run",
        "--preflight",
        "--config",
        "/etc/c.toml",
    ]


async def test_the_preflight_child_runs_in_the_daemons_session_where_the_reaper_leaves_it(tmp_path: Path) -> None:
    """A child in a session of its own is what `cgroup.adopted_orphans` takes for an orphan of the
    server tree: the poll's reaper could waitpid the preflight first, asyncio then reports exit 255,
    and a good handoff was refused (CI, 2026-12-06)."""
    from supervisor.process.cgroup import adopted_orphans
    from supervisor.root.preflight import preflight

    out = tmp_path / "sid"
    probe = (
        "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getsid(0))); time.sleep(0.3)"
    )
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    task = preflight(cfg, dict(os.environ), argv=[sys.executable, "-c", probe, str(out)])
    import asyncio

    running = asyncio.ensure_future(task)
    while not out.exists() or not out.read_text():
        await asyncio.sleep(0.02)
    assert int(out.read_text()) == os.getsid(0)
    assert adopted_orphans() == []  # the reaper sees no orphan to take
    assert await running is None


# ---- issue 50: the successor takes over the API's socket, so the preflight checks the address ----


def test_the_preflight_refuses_a_config_that_moves_the_api(tmp_path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from simconfig import sim_settings

    from supervisor.config.render import dump_toml
    from supervisor.host.inherit import HANDOFF_API_ENV, TAKES_OVER

    settings = sim_settings(tmp_path, "ok")
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_toml(settings))
    here = f"{settings.api.host} {settings.api.port}"
    monkeypatch.setenv(HANDOFF_API_ENV, here)
    assert cli.main(["run", "--preflight", "--config", str(cfg)]) == 0
    assert TAKES_OVER in capsys.readouterr().out  # what the old daemon waits to hear
    monkeypatch.setenv(HANDOFF_API_ENV, f"{settings.api.host} {settings.api.port + 1}")
    assert cli.main(["run", "--preflight", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{settings.api.port + 1}" in err and "keeps its socket" in err and "systemctl restart" in err


async def test_a_successor_that_does_not_say_it_takes_the_socket_over_is_refused(tmp_path: Path) -> None:
    """Code on disk from before the socket was inherited would bind the port afresh: the port would
    be free between the two images, which is the squatter's gap; the handoff is refused instead."""
    from supervisor.host.inherit import HANDOFF_API_ENV, TAKES_OVER
    from supervisor.root.preflight import preflight

    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    old = [sys.executable, "-c", "print('sglang-supervisor 0.1.0: c.toml would start')"]
    why = await preflight(cfg, dict(os.environ), argv=old, api=("127.0.0.1", 8700))
    assert why is not None and "bind the API port afresh" in why and "restart" in why
    said = f"import os; print('would start; a handoff to it {TAKES_OVER}', os.environ['{HANDOFF_API_ENV}'])"
    assert await preflight(cfg, dict(os.environ), argv=[sys.executable, "-c", said], api=("127.0.0.1", 8700)) is None
    assert await preflight(cfg, dict(os.environ), argv=old) is None  # no address asked: the old rule
