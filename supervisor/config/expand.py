"""`${VAR}` and `${VAR:-default}` in the config's string values, expanded once at load.

One config file then serves every node of a group: `node_rank = "${LWS_WORKER_INDEX}"`,
`dist-init-addr = "${LWS_LEADER_ADDRESS}:20000"`. Pure: the environment is an argument. An unset
variable without a default is an error naming the key and the variable; `$$` is a literal `$`.
A value that was nothing but an expansion and reads as a whole number becomes an int where the
settings model wants one (`int_keys`), so `node_rank = "${LWS_WORKER_INDEX}"` validates.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_WHOLE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*(?::-[^}]*)?\}$")
_INT = re.compile(r"^[+-]?[0-9]+$")


class ExpansionError(ValueError):
    """An unset variable without a default; the message names the key and the variable."""


def _expand_str(value: str, key: str, env: Mapping[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, default = m.group(1), m.group(2)
        got = env.get(name)
        if got is None or (got == "" and default is not None):
            if default is None:
                raise ExpansionError(
                    f"{key}: ${{{name}}} is not set in the daemon's environment "
                    f"(set it, or give a default: ${{{name}:-value}})"
                )
            return default
        return got

    return _REF.sub(sub, value)


def expand(data: Any, env: Mapping[str, str], int_keys: frozenset[str] = frozenset(), key: str = "") -> Any:
    """`data` (parsed TOML) with every string expanded; raises ExpansionError naming the key."""
    if isinstance(data, str):
        if "$" not in data:
            return data
        out = _expand_str(data, key or "(top level)", env)
        if key in int_keys and _WHOLE.match(data) and _INT.match(out.strip()):
            return int(out.strip())
        return out
    if isinstance(data, Mapping):
        return {k: expand(v, env, int_keys, f"{key}.{k}" if key else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [expand(v, env, int_keys, f"{key}[{i}]") for i, v in enumerate(data)]
    return data
