"""The SIGUSR2 handoff's proof, before the old daemon lets go: the code now on disk validates the
configuration file it will start with (`sglang-supervisor run --preflight --config FILE`: the
settings, the API token and its bind, the notification secrets), in a child process.

Before this (issue 33) an upgrade onto a config the new code refused exited 2 after the old
process had let go: the server kept serving unsupervised and the unit's start limit was spent in
25 s. Now a refusal keeps the old daemon in charge; it journals `handoff_refused` with the reason.

The new image takes over the API's listening socket and the state directory's lock across the exec
(supervisor.host.inherit), so the preflight is told where the running daemon listens and refuses a
config that would listen elsewhere; and the old daemon hands off only to code that says it takes
both over (`inherit.TAKES_OVER`): code that does not would bind the port afresh, and the port would
be free between the two images for anyone to take (issue 50).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from supervisor.common.configerror import ConfigError
from supervisor.common.toolproc import run_tool
from supervisor.host.inherit import HANDOFF_API_ENV, TAKES_OVER

PREFLIGHT_TIMEOUT_S = 60.0  # Python's start and the imports take 1-2 s; a loaded machine, more


def preflight_argv(config_path: Path, orig_argv: Sequence[str] | None = None) -> list[str]:
    """The command line the handoff re-executes (`reexec`), with `--preflight`; when this process
    was not started as `... run --config FILE` (in-process tests), `python -m supervisor run`."""
    argv = list(sys.orig_argv if orig_argv is None else orig_argv)
    if "run" in argv[1:] and "--preflight" not in argv:
        return [sys.executable, *argv[1:], "--preflight"]
    return [sys.executable, "-m", "supervisor", "run", "--preflight", "--config", str(config_path)]


async def preflight(
    config_path: Path | None,
    env: Mapping[str, str],
    argv: Sequence[str] | None = None,
    api: tuple[str, int] | None = None,
) -> str | None:
    """None when the successor would start; else why not (its own words, bounded). `api`: where
    this daemon listens, which the successor's config must name too (it inherits the socket)."""
    if config_path is None:
        return None  # nothing on disk to validate: the successor starts from the same settings
    cmd = tuple(argv) if argv is not None else tuple(preflight_argv(config_path))
    if api is not None:
        env = {**env, HANDOFF_API_ENV: f"{api[0]} {api[1]}"}
    # In the daemon's session: a child in a session of its own is taken for an orphan of the server
    # tree, and the poll's reaper could waitpid it first (asyncio then reports exit 255 and the
    # handoff was refused for nothing: CI, 2026-12-06).
    res = await run_tool(cmd, PREFLIGHT_TIMEOUT_S, env=env, cap_bytes=16384, own_session=False)
    if res.exit_code == 0 and (api is None or TAKES_OVER in res.stdout):
        return None
    if res.exit_code == 0:
        return (
            "the new code would bind the API port afresh instead of taking over this daemon's socket "
            "(a version without it): the port would be free between the two images; restart the "
            "service instead (systemctl restart)"
        )
    if res.missing:
        return f"cannot run the new code: {res.stderr.strip()[:300]}"
    if res.timed_out:
        return f"the new code's preflight did not finish in {PREFLIGHT_TIMEOUT_S:g} s"
    said = " ".join(res.stderr.strip().split())[-600:] or f"exit {res.exit_code}"
    return f"the new code refuses the configuration (exit {res.exit_code}): {said}"


def check(config: str, env: Mapping[str, str]) -> None:
    """What `run --preflight` validates; ConfigError naming the first problem."""
    from supervisor.alerting.deliver import load_secrets
    from supervisor.common.apitoken import check_bind, load_token
    from supervisor.config.settings import load_settings

    settings = load_settings(config)
    token = load_token(settings.api, env)
    check_bind(settings.api.host, token)
    for target in settings.notify:
        load_secrets(target)
    check_address(env.get(HANDOFF_API_ENV), settings.api.host, settings.api.port)


def check_address(running: str | None, host: str, port: int) -> None:
    """A handoff keeps the running daemon's listening socket: the new config must name its address
    (`running`: "HOST PORT", from the daemon asking; None: not a handoff)."""
    if running is None:
        return
    was_host, _, was_port = running.strip().rpartition(" ")
    if (was_host, was_port) != (host, str(port)):
        raise ConfigError(
            f"[api] listens on {host}:{port} in this config, but the running daemon listens on "
            f"{was_host}:{was_port}, and a handoff keeps its socket: put [api] host/port back, or move "
            "the API with a restart (systemctl restart) instead of a handoff"
        )
