"""Settings turned into what runs and what is written: each rung's command line, and the config as TOML."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.config.settings import ArgValue, Rung, ServerSettings, Settings
from supervisor.engines import profile_of


@dataclass(frozen=True)
class RenderedCommand:
    rung: str
    argv: tuple[str, ...]
    env: dict[str, str]  # the rung's environment additions over the daemon's own environment

    def shell(self) -> str:
        return shlex.join(self.argv)


def _render_args(args: Mapping[str, ArgValue]) -> list[str]:
    out: list[str] = []
    for key, value in args.items():
        flag = f"--{key}"
        if value is True:
            out.append(flag)
        elif value is False:
            continue
        elif isinstance(value, list):
            out.append(flag)
            out.extend(str(v) for v in value)
        else:
            out.extend((flag, str(value)))
    return out


def rung_command(server: ServerSettings, rung: Rung) -> tuple[str, ...]:
    """The program a rung runs: its own `command`, else its own engine's default when it changes
    engine, else the base configuration's."""
    if rung.command is not None:
        return rung.command
    if rung.engine is not None and rung.engine != server.engine:
        return profile_of(rung.engine).default_command
    return server.command


def render_rung(server: ServerSettings, rung: Rung) -> RenderedCommand:
    """Base args, then the rung's args (set or override), minus `drop`, then host and port. A rung
    that sets its own engine or command runs its own args alone (DESIGN: "its `args` start from its
    own empty set"); the environment always layers over the base's."""
    args: dict[str, ArgValue] = {} if rung.own_args else dict(server.args)
    args.update(rung.args)
    for key in rung.drop:
        args.pop(key, None)
    env = dict(server.env)
    env.update(rung.env)
    argv = [*rung_command(server, rung), *_render_args(args), "--host", server.host, "--port", str(server.port)]
    return RenderedCommand(rung=rung.name, argv=tuple(argv), env=env)


def render_ladder(settings: Settings) -> tuple[RenderedCommand, ...]:
    return tuple(render_rung(settings.server, r) for r in settings.ladder)


def arg_names(argv: Sequence[str]) -> set[str]:
    return {a[2:] for a in argv if a.startswith("--")}


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        items = (f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items() if x is not None)
        return "{ " + ", ".join(items) + " }"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def dump_toml(settings: Settings) -> str:
    """The settings as a TOML config that `load_settings` reads back to equal settings."""
    return dump_mapping(settings.model_dump())


def dump_mapping(data: Mapping[str, Any]) -> str:
    """A config mapping as TOML: each section a table, each list of rungs or targets an array of
    tables (`[[fallback]]`, `[[notify]]`) after them; None values are left out."""
    arrays = [k for k, v in data.items() if isinstance(v, (list, tuple))]
    out: list[str] = []
    for section, body in data.items():
        if section in arrays or body is None:
            continue
        out.append(f"[{section}]")
        out.extend(f"{k} = {_toml_value(v)}" for k, v in body.items() if v is not None)
    for table in arrays:
        for item in data[table]:
            out.append(f"[[{table}]]")
            out.extend(f"{k} = {_toml_value(v)}" for k, v in item.items() if v is not None)
    return "\n".join(out) + "\n"
