"""Where a client command finds the daemon: only `[api]` of the daemon's config, and its token.

The client must reach the daemon even when the rest of the file has a typo (that is exactly when
an operator runs `reload` and wants to hear the daemon refuse it), so it reads the TOML, takes the
`[api]` table alone and ignores every other section. Without `--config` it looks at
`$SGLANG_SUPERVISOR_CONFIG`, then at `/etc/sglang-supervisor/config.toml` (the installed path), so
`sglang-supervisor status` works on a host as it is installed.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from supervisor.config.settings import ApiSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found,no-redef]

CONFIG_ENV = "SGLANG_SUPERVISOR_CONFIG"
DEFAULT_CONFIG = Path("/etc/sglang-supervisor/config.toml")


class ClientConfigError(Exception):
    """The config names no usable address or token; the message says which key and why."""


@dataclass(frozen=True)
class ConfigChoice:
    path: Path | None  # the file to read, or None: the built-in defaults
    explicit: bool  # named by --config or the environment (a file that is missing is an error then)


def choose_config(flag: str | None, env: Mapping[str, str], default: Path | None = None) -> ConfigChoice:
    """--config, else $SGLANG_SUPERVISOR_CONFIG, else the installed path when it exists."""
    default = DEFAULT_CONFIG if default is None else default
    if flag:
        return ConfigChoice(Path(flag), True)
    named = env.get(CONFIG_ENV, "").strip()
    if named:
        return ConfigChoice(Path(named), True)
    return ConfigChoice(default if default.exists() else None, False)


def api_settings(path: Path) -> tuple[ApiSettings, list[str]]:
    """`[api]` of the config at `path`, and notes on what was ignored there (unknown keys)."""
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as err:
        raise ClientConfigError(f"{path}: cannot read config: {err.strerror or err}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ClientConfigError(f"{path}: not valid TOML: {err}") from None
    section = data.get("api", {})
    if not isinstance(section, dict):
        raise ClientConfigError(f"{path}: [api] must be a table")
    known = set(ApiSettings.model_fields)
    notes = [f"{path}: ignoring unknown key api.{k}" for k in sorted(section) if k not in known]
    try:
        return ApiSettings.model_validate({k: v for k, v in section.items() if k in known}), notes
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ClientConfigError(f"{path}: api.{key}: {first['msg']}") from None
