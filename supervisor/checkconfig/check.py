"""What `check-config` finds wrong in a config that parses: things `run` would refuse, or that
cannot work as written. Each finding names the key; errors fail the check, warnings fail it only
under `--strict` (they depend on what this shell cannot see, such as the service's environment).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from supervisor.checkconfig.cachecheck import cache_findings
from supervisor.checkconfig.groupcheck import group_findings
from supervisor.checkconfig.portcheck import port_findings
from supervisor.checkconfig.watchdogcheck import watchdog_findings
from supervisor.common.configerror import ConfigError
from supervisor.config.render import render_rung
from supervisor.config.settings import Settings

Which = Callable[[str, str | None], str | None]


@dataclass(frozen=True)
class Finding:
    level: Literal["error", "warning"]
    key: str
    message: str

    def line(self) -> str:
        return f"{self.level}: {self.key}: {self.message}"


def _which(name: str, path: str | None) -> str | None:
    return shutil.which(name, path=path)


def check_settings(settings: Settings, env: Mapping[str, str], which: Which = _which) -> tuple[Finding, ...]:
    """Every finding for `settings` as `run` would meet them with the environment `env`."""
    sglang_wd = [Finding(f.level, f.key, f.message) for f in watchdog_findings(settings)]
    return (
        *_api(settings, env),
        *_program(settings, env, which),
        *_rungs(settings),
        *_notify(settings, env, which),
        *_gpus(settings, env),
        *(Finding(level, key, msg) for level, key, msg in port_findings(settings)),
        *sglang_wd,
        *(Finding(level, key, msg) for level, key, msg in group_findings(settings)),
        *(Finding(level, key, msg) for level, key, msg in cache_findings(settings)),
    )


def _gpus(settings: Settings, env: Mapping[str, str]) -> list[Finding]:
    """Processes outside the server holding memory on its GPUs, judged as the first launch would
    judge them under `[slate] gpu_strangers` (supervisor/policy/gpufit.py): a warning when that
    launch would wait or fail now; a simulated GPU whose file cannot be read (the probe would
    report `unavailable` until it can)."""
    from probes.gpu import GpuProbe
    from supervisor.daemon import cleanslate as cs
    from supervisor.policy import gpufit
    from supervisor.root.gpusource import open_nvml

    probe = GpuProbe(open_nvml(settings.gpu))
    try:
        gpu = probe.snapshot_all()
    finally:
        probe.close()
    if gpu.status != "ok":
        if settings.gpu.simulated:
            return [Finding("warning", "gpu.file", f"the GPU probe would report unavailable: {gpu.reason}")]
        return []
    base = render_rung(settings.server, settings.ladder[0])
    gpus = cs.visible_gpus({**env, **base.env}, gpu)
    strangers = [
        gpufit.Stranger(p, g, b, c) for p, g, b, c in cs.gpu_holders(gpu, (), gpus, cs.command_of) if cs.pid_alive(p)
    ]
    rooms = [
        gpufit.GpuRoom(d.index, d.mem_total_bytes, d.mem_used_bytes)
        for d in gpu.devices
        if gpus is None or d.index in gpus
    ]
    slate = settings.slate
    decision = gpufit.decide(rooms, strangers, gpufit.need_of(base.argv, slate.gpu_need_gib), slate.gpu_strangers)
    if decision.action == "launch":
        return []
    act = "would wait" if decision.action == "wait" else "would fail"
    return [Finding("warning", "slate.gpu_strangers", f"the launch of rung {base.rung} {act} now: {decision.why}")]


def _api(settings: Settings, env: Mapping[str, str]) -> list[Finding]:
    from supervisor.common.apitoken import is_loopback, load_token, too_short  # the very checks `run` makes

    api = settings.api
    if api.token_file:
        try:
            token = load_token(api, env)
        except ConfigError as err:
            return [Finding("error", "api.token_file", str(err).removeprefix("[api] token_file "))]
        short = too_short(token or "")
        return [Finding("error", "api.token_file", f"{api.token_file!r}: {short}")] if short else []
    from_env = env.get(api.token_env, "").strip()
    if from_env:
        short = too_short(from_env)
        return [Finding("error", "api.token_env", f"${api.token_env}: {short}")] if short else []
    if is_loopback(api.host):
        return []
    return [
        Finding(
            "warning",
            "api.host",
            f"{api.host!r} is not a loopback address and there is no token_file; `run` refuses to start "
            f"unless ${api.token_env} is set in its environment (it is not set here). Set [api] token_file "
            "(mode 0600) or bind 127.0.0.1",
        )
    ]


def _program(settings: Settings, env: Mapping[str, str], which: Which) -> list[Finding]:
    srv = settings.server
    program = srv.command[0]
    if "/" in program:
        path = Path(program)
        if not path.is_absolute() and srv.cwd:
            path = Path(srv.cwd) / path
        try:
            regular = path.is_file()
        except OSError as err:  # e.g. a parent directory this user may not search
            return [Finding("error", "server.command", f"{program!r}: {err.strerror or err}")]
        if not regular:
            return [Finding("error", "server.command", f"{program!r} does not exist")]
        if not os.access(path, os.X_OK):
            return [Finding("error", "server.command", f"{program!r} is not executable")]
        return []
    search = srv.env.get("PATH", env.get("PATH"))
    if which(program, search) is None:
        return [Finding("error", "server.command", f"{program!r} is not found on PATH ({search or 'unset'})")]
    return []


def _rungs(settings: Settings) -> list[Finding]:
    out: list[Finding] = []
    base = render_rung(settings.server, settings.ladder[0])
    for i, rung in enumerate(settings.fallback):
        key = f"fallback[{i}] ({rung.name})"
        for name in rung.drop:
            if name not in settings.server.args and name not in rung.args:
                out.append(
                    Finding(
                        "error",
                        f"{key}.drop",
                        f"{name!r} is not an argument of [server.args], so dropping it changes nothing "
                        f"(arguments there: {', '.join(settings.server.args) or 'none'})",
                    )
                )
        if "spec_regression" in rung.on and settings.watchdog.on_spec_regression == "alert":
            out.append(
                Finding(
                    "error",
                    f"{key}.on",
                    "'spec_regression' never triggers a rung while [watchdog] on_spec_regression = \"alert\" "
                    '(a regression only alerts); set it to "fallback" or remove the trigger',
                )
            )
        rendered = render_rung(settings.server, rung)
        if rendered.argv == base.argv and rendered.env == base.env:
            out.append(Finding("warning", key, "runs exactly the base configuration's command and environment"))
    return out


def _notify(settings: Settings, env: Mapping[str, str], which: Which) -> list[Finding]:
    """[[notify]]: the secret files `run` reads at start, and each exec hook's program."""
    from supervisor.alerting.deliver import load_secrets

    out: list[Finding] = []
    for i, target in enumerate(settings.notify):
        key = f"notify[{i}] ({target.name})"
        try:
            load_secrets(target)
        except ConfigError as err:
            out.append(Finding("error", key, str(err)))
        if target.kind == "exec":
            program = target.argv[0]
            found = os.access(program, os.X_OK) if "/" in program else which(program, env.get("PATH")) is not None
            if not found:
                out.append(Finding("error", f"{key}.argv", f"{program!r} is not an executable program"))
    return out
