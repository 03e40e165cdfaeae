"""`check-config`: print every rung's command line, and check its flags with its engine's own parser.

The parser lives in the server's environment, not the daemon's: the rung's interpreter (the first
element of its command) runs a small script that builds its engine's argparse parser (SGLang's
`ServerArgs.add_cli_args`, vLLM's `make_arg_parser`; supervisor/engines) and parses each rung's
arguments. A ladder that crosses engines is checked by both. A typo in a fallback rung is found at
install time, not during the first incident at night.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from supervisor.checkconfig.check import check_settings
from supervisor.checkconfig.groupcheck import group_doc, group_line
from supervisor.checkconfig.notifycheck import notify_doc, notify_lines
from supervisor.checkconfig.windowcheck import all_windows, window_lines
from supervisor.common.redact import Redactor
from supervisor.config.render import render_ladder, rung_command
from supervisor.config.settings import Settings
from supervisor.engines import Engine, EngineProfile, profile_of

# The engine's own parser (`make_parser`, from its profile) is defined before this runs.
_SCRIPT = r"""
out = {"importable": True, "rungs": {}}
for name, argv in json.loads(sys.stdin.read()):
    parser = make_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
        out["rungs"][name] = ""
    except SystemExit:
        out["rungs"][name] = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "rejected"
    except argparse.ArgumentError as e:
        out["rungs"][name] = str(e)
print(json.dumps(out))
"""


def _script(profile: EngineProfile) -> str:
    """The engine's parser, guarded: an engine that cannot be imported says so as JSON."""
    body = "\n".join("    " + line for line in profile.parser.splitlines())
    return (
        "import argparse, contextlib, io, json, sys\n"
        f"try:\n{body}\n"
        "except Exception as e:\n"
        "    print(json.dumps({'importable': False, 'error': repr(e)}))\n"
        "    sys.exit(0)\n" + _SCRIPT
    )


@dataclass(frozen=True)
class ParserRun:
    """One run of an engine's parser over the rungs that share its interpreter and environment."""

    engine: EngineProfile
    interp: str
    env: tuple[tuple[str, str], ...]
    cwd: str | None
    rungs: tuple[tuple[str, tuple[str, ...]], ...]  # (rung, its server arguments)


def _runs(settings: Settings) -> list[ParserRun]:
    groups: dict[tuple[Engine, str, tuple[tuple[str, str], ...]], list[tuple[str, tuple[str, ...]]]] = {}
    for rung, r in zip(settings.ladder, render_ladder(settings), strict=True):
        command = rung_command(settings.server, rung)
        key = (settings.engine_of(rung), command[0], tuple(sorted(r.env.items())))
        groups.setdefault(key, []).append((r.rung, r.argv[len(command) :]))
    return [
        ParserRun(profile_of(engine), interp, env, settings.server.cwd, tuple(rungs))
        for (engine, interp, env), rungs in groups.items()
    ]


def _parse(run: ParserRun, timeout_s: float) -> tuple[bool | None, str, dict[str, str]]:
    label, interp = run.engine.label, run.interp
    if not Path(interp).name.startswith("python"):
        return None, f"could not check: {interp!r} is not a Python interpreter", {}
    payload = json.dumps([(name, list(argv)) for name, argv in run.rungs])
    try:
        proc = subprocess.run(
            [interp, "-c", _script(run.engine)],
            input=payload,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **dict(run.env)},
            cwd=run.cwd,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"could not check: running {interp} failed ({err})", {}
    try:
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"could not check: {interp} printed no result (stderr: {proc.stderr.strip()[-300:]})", {}
    if not doc.get("importable"):
        return None, f"could not check: {run.engine.name} is not importable by {interp} ({doc.get('error', '')})", {}
    errors = {k: v for k, v in doc.get("rungs", {}).items() if v}
    if errors:
        return False, f"{label}'s parser rejected some rungs", errors
    return True, "", {}


def validate_with_engines(settings: Settings, timeout_s: float = 120.0) -> tuple[bool | None, str, dict[str, str]]:
    """(ok, message, per-rung errors): every rung's arguments through its own engine's parser, run by
    the rung's interpreter with the rung's environment; ok is None when a parser could not be reached."""
    results = [(run, *_parse(run, timeout_s)) for run in _runs(settings)]
    errors = {k: v for _, _, _, errs in results for k, v in errs.items()}
    labels = sorted({run.engine.label for run, *_ in results})
    if errors:
        return False, " ".join(msg for _, ok, msg, _ in results if ok is False), errors
    unreached = list(dict.fromkeys(msg for _, ok, msg, _ in results if ok is None))  # one line per reason
    if unreached:
        return None, "; ".join(unreached), {}
    own = " and ".join(f"{label}'s" for label in labels)
    return True, f"every rung's arguments parse with {own} own parser{'s' if len(labels) > 1 else ''}", {}


def check_rungs(
    settings: Settings,
    *,
    validate: bool,
    out: TextIO,
    env: Mapping[str, str] | None = None,
    strict: bool = False,
) -> int:
    """Print every rung (secrets redacted: this output ends up in CI logs and tickets), what `run`
    would refuse or cannot work (errors; warnings too under `strict`), then validate the flags."""
    if settings.group is not None:
        out.write(group_line(settings.group) + "\n")
    windows = all_windows(settings)
    for i, r in enumerate(render_ladder(settings)):
        rung = settings.ladder[i]
        redact = Redactor.from_envs([r.env])
        engine = settings.engine_of(rung)
        out.write(f"rung {i} {r.rung} [{engine}]{'  (on: ' + ', '.join(rung.on) + ')' if rung.on else ''}\n")
        out.write(f"  command: {shlex.join(redact.argv(r.argv))}\n")
        if r.env:
            out.write("  env: " + " ".join(f"{k}={v}" for k, v in redact.env(r.env).items()) + "\n")
        out.write("\n".join(window_lines(windows[r.rung])) + "\n")
    out.write(f"gpu: {settings.gpu.describe()}\n")
    out.write(f"slate: {settings.slate.describe()}\n")
    for line in notify_lines(settings):
        out.write(line + "\n")
    findings = check_settings(settings, os.environ if env is None else env)
    for f in findings:
        out.write(f.line() + "\n")
    failed = any(f.level == "error" or strict for f in findings)
    if validate:
        ok, msg, errors = validate_with_engines(settings)
        for name, err in errors.items():
            out.write(f"rung {name}: {err}\n")
        out.write(f"{msg}\n")
        failed = failed or ok is False
    if failed:
        out.write("config NOT OK\n")
        return 1
    warned = f" ({len(findings)} warning{'s' if len(findings) > 1 else ''})" if findings else ""
    checked = "" if validate else " (rung arguments not checked against the engines' parsers)"
    out.write(f"config OK{warned}{checked}\n")
    return 0


def check_rungs_json(
    settings: Settings, *, validate: bool, out: TextIO, env: Mapping[str, str] | None = None, strict: bool = False
) -> int:
    """`check-config --json`: the same checks as `check_rungs`, as one JSON document."""
    rungs = []
    windows = all_windows(settings)
    for i, r in enumerate(render_ladder(settings)):
        redact = Redactor.from_envs([r.env])
        argv = list(redact.argv(r.argv))
        rung_doc = {
            "name": r.rung, "engine": settings.engine_of(settings.ladder[i]), "on": list(settings.ladder[i].on),
            "argv": argv, "env": redact.env(r.env),
        }  # fmt: skip
        rungs.append({**rung_doc, "stall_windows": windows[r.rung]})
    findings = check_settings(settings, os.environ if env is None else env)
    failed = any(f.level == "error" or strict for f in findings)
    doc: dict[str, object] = {
        "rungs": rungs,
        "gpu": {"source": settings.gpu.source, "file": settings.gpu.file, "detail": settings.gpu.describe()},
        "slate": {**settings.slate.model_dump(), "detail": settings.slate.describe()},
        "findings": [{"level": f.level, "key": f.key, "message": f.message} for f in findings],
        "notify": [notify_doc(t) for t in settings.notify],
    }
    if settings.group is not None:
        doc["group"] = group_doc(settings.group)
    if validate:
        ok, msg, errors = validate_with_engines(settings)
        doc["sglang"] = {"ok": ok, "message": msg, "errors": errors}
        failed = failed or ok is False
    doc["ok"] = not failed
    out.write(json.dumps(doc, indent=2) + "\n")
    return 1 if failed else 0
