"""Whether the `supervisor` package this process imported is sglang-supervisor's own (issue 53).

The wheel's top-level packages are `supervisor`, `api` and `probes`; supervisord's Python package is
also `supervisor`. Installed into one environment, the two overwrite each other's files in one
directory, or one shadows the other on `sys.path`, and either program breaks in ways that say
nothing of the cause. The install is isolated (the daemon's own virtual environment, or pipx:
systemd/README.md), and the daemon checks it at start: it refuses, naming the path, when the package
it imported is not where its distribution put it, or when another distribution also claims files of
that package directory.

Pure apart from reading the installed distributions' metadata; no clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

DIST = "sglang-supervisor"
PACKAGE = "supervisor"
FIX = (
    "install sglang-supervisor into its own virtual environment, e.g. `python3 -m venv /opt/sglang-supervisor && "
    "/opt/sglang-supervisor/bin/pip install sglang-supervisor` (or pipx), and run that environment's "
    '`sglang-supervisor` (systemd/README.md, "Install")'
)


@dataclass(frozen=True)
class Claim:
    """A distribution that claims files of a package directory."""

    name: str
    version: str
    directory: Path


def claims(dists: Iterable[metadata.Distribution], package: str = PACKAGE) -> list[Claim]:
    """Each distribution listing `package/__init__.py` among its files, with where it lies."""
    out = []
    for d in dists:
        for f in d.files or ():
            if f.parts[-2:] == (package, "__init__.py") and len(f.parts) >= 2:
                where = Path(str(d.locate_file(f))).resolve().parent
                out.append(Claim(d.metadata["Name"] or "?", d.version or "?", where))
                break
    return out


def _editable_root(d: metadata.Distribution) -> Path | None:
    """The source tree of an editable install (`pip install -e`), from its direct_url.json."""
    text = d.read_text("direct_url.json")
    try:
        info = json.loads(text) if text else {}
    except ValueError:
        return None
    url = info.get("url", "") if isinstance(info, dict) else ""
    editable = isinstance(info, dict) and isinstance(info.get("dir_info"), dict) and info["dir_info"].get("editable")
    return Path(url[len("file://") :]).resolve() if editable and url.startswith("file://") else None


def problem(imported: Path, dists: Iterable[metadata.Distribution]) -> str | None:
    """Why the `supervisor` package at `imported` (its directory) is not this program's own, or None."""
    imported = imported.resolve()
    everything = list(dists)
    ours = [d for d in everything if (d.metadata["Name"] or "").lower().replace("_", "-") == DIST]
    others = [c for c in claims(d for d in everything if d not in ours) if c.directory == imported]
    if others:
        names = ", ".join(f"{c.name} {c.version}" for c in others)
        return (
            f"the package `{PACKAGE}` at {imported} also holds files of {names} (supervisord's package is "
            f"named `{PACKAGE}` too): the two programs' files are mixed in one directory; {FIX}"
        )
    if not ours:
        return None  # run from a source tree (PYTHONPATH): nothing installed to compare with
    own = claims(ours)
    if own:
        expected = own[0].directory
    else:
        root = _editable_root(ours[0])
        if root is None:
            return None
        expected = root / PACKAGE
    if imported != expected:
        return (
            f"`import {PACKAGE}` resolves to {imported}, not to sglang-supervisor's own package at {expected} "
            f"(another distribution's package of the same name comes first on sys.path); {FIX}"
        )
    return None


def check() -> str | None:
    """`problem` for the package this process imported (the one this module lies in) and the
    distributions installed."""
    return problem(Path(__file__).resolve().parents[1], metadata.distributions())
