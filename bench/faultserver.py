"""The fault script's server command: picks the simulator's fault for this launch, then becomes it.

The daemon's `[server] command` in `python -m bench.outage --script day` is this file run as a
script (`PYTHON bench/faultserver.py ARGS...`). It reads the bench's control file (its path in
`SGLANG_FAULT_CONTROL`), picks the environment of the first rule that matches the launch's command
line, and execs `PYTHON -m supervisor.simulator ARGS...` with it: the same pid, the same argv after
the interpreter, so the daemon supervises the simulator as it would any server. The daemon never
reads the control file (it is the bench's, like the simulator's onset file).

The control file (JSON, replaced atomically by the bench):

    {"rules": [{"unless": ["disable-cuda-graph"], "env": {"SGLANG_SIM_SCENARIO": "busy_capture_hang"}},
               {"with": ["speculative-algorithm"], "env": {"SGLANG_SIM_SCENARIO": "low_accept"}}]}

A rule matches when every flag in `with` is on the command line and none in `unless` is (a flag
counts bare or with a value, `--name` or `--name=value`). No rule matching, no file or a bad one:
the configured environment as it is. Standard library only: it runs under whichever interpreter
the daemon under test uses (an older checkout's too).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

CONTROL_ENV = "SGLANG_FAULT_CONTROL"


def flags(argv: Sequence[str]) -> frozenset[str]:
    """The option names on a command line, without their dashes or values."""
    return frozenset(a[2:].split("=", 1)[0] for a in argv if a.startswith("--") and len(a) > 2)


def select_env(control: Mapping[str, Any], argv: Sequence[str]) -> dict[str, str]:
    """The environment the first matching rule adds for a launch with `argv` ({} when none matches)."""
    given = flags(argv)
    rules = control.get("rules")
    for rule in rules if isinstance(rules, list) else []:
        if not isinstance(rule, dict):
            continue
        need, unless = rule.get("with") or [], rule.get("unless") or []
        if all(n in given for n in need) and not any(u in given for u in unless):
            env = rule.get("env") or {}
            return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
    return {}


def read_control(path: str | None) -> dict[str, Any]:
    """The control file's mapping; {} when unset, missing or not a JSON object."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def main(argv: Sequence[str]) -> None:
    env = dict(os.environ)
    env.update(select_env(read_control(env.get(CONTROL_ENV)), argv))
    os.execve(sys.executable, [sys.executable, "-m", "supervisor.simulator", *argv], env)


if __name__ == "__main__":
    main(sys.argv[1:])
