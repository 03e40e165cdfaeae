"""`check-config`: print every rung's command line, and check its flags with SGLang's own parser.

The parser lives in the server's environment, not the daemon's: the server's interpreter (the
first element of `[server] command`) runs a small script that builds SGLang's argparse parser
(`ServerArgs.add_cli_args`) and parses each rung's arguments. A typo in a fallback rung is found at
install time, not during the first incident at night.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from supervisor.checkconfig.check import check_settings
from supervisor.checkconfig.groupcheck import group_doc, group_line
from supervisor.checkconfig.notifycheck import notify_doc, notify_lines
from supervisor.checkconfig.windowcheck import all_windows, window_lines
from supervisor.common.redact import Redactor
from supervisor.config.render import RenderedCommand, render_ladder
from supervisor.config.settings import Settings

_SCRIPT = r"""
import argparse, contextlib, io, json, sys
try:
    from sglang.srt.server_args import ServerArgs
except Exception as e:
    print(json.dumps({"importable": False, "error": repr(e)}))
    sys.exit(0)
out = {"importable": True, "rungs": {}}
for name, argv in json.loads(sys.stdin.read()):
    parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
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


def _server_args(r: RenderedCommand, prefix_len: int) -> list[str]:
    return list(r.argv[prefix_len:])


def validate_with_sglang(settings: Settings, timeout_s: float = 120.0) -> tuple[bool | None, str, dict[str, str]]:
    """(ok, message, per-rung errors); ok is None when SGLang's parser could not be reached."""
    cmd = settings.server.command
    interp = cmd[0]
    if not Path(interp).name.startswith("python"):
        return None, f"could not check: {interp!r} is not a Python interpreter", {}
    rendered = render_ladder(settings)
    payload = json.dumps([(r.rung, _server_args(r, len(cmd))) for r in rendered])
    env = {**os.environ, **settings.server.env}
    try:
        proc = subprocess.run(
            [interp, "-c", _SCRIPT],
            input=payload,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=settings.server.cwd,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"could not check: running {interp} failed ({err})", {}
    try:
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"could not check: {interp} printed no result (stderr: {proc.stderr.strip()[-300:]})", {}
    if not doc.get("importable"):
        return None, f"could not check: sglang is not importable by {interp} ({doc.get('error', '')})", {}
    errors = {k: v for k, v in doc.get("rungs", {}).items() if v}
    if errors:
        return False, "SGLang's parser rejected some rungs", errors
    return True, "every rung's arguments parse with SGLang's own parser", {}


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
        out.write(f"rung {i} {r.rung}{'  (on: ' + ', '.join(rung.on) + ')' if rung.on else ''}\n")
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
        ok, msg, errors = validate_with_sglang(settings)
        for name, err in errors.items():
            out.write(f"rung {name}: {err}\n")
        out.write(f"{msg}\n")
        failed = failed or ok is False
    if failed:
        out.write("config NOT OK\n")
        return 1
    warned = f" ({len(findings)} warning{'s' if len(findings) > 1 else ''})" if findings else ""
    checked = "" if validate else " (rung arguments not checked against SGLang)"
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
        rung_doc = {"name": r.rung, "on": list(settings.ladder[i].on), "argv": argv, "env": redact.env(r.env)}
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
        ok, msg, errors = validate_with_sglang(settings)
        doc["sglang"] = {"ok": ok, "message": msg, "errors": errors}
        failed = failed or ok is False
    doc["ok"] = not failed
    out.write(json.dumps(doc, indent=2) + "\n")
    return 1 if failed else 0
