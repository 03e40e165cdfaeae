"""Every incident gets an id of its own: the time-and-cause id, with `-2`, `-3`... when that second
already has one (two restarts 0.28 s apart got the same id, and the second bundle overwrote the
first). `taken`, the owner's memory of recent ids, is kept to the last `KEEP`."""

from __future__ import annotations

from pathlib import Path

from supervisor.diagnostics import new_incident_id

KEEP = 100


def unique_incident_id(wall: float, cause: str, taken: list[str], diagnostics: Path) -> str:
    """A daemon restarted within the second has no memory of the ids: the bundle directories
    under `diagnostics` say which are taken."""
    base = new_incident_id(wall, cause)
    candidate, n = base, 1
    while candidate in taken or (diagnostics / candidate).exists():
        n += 1
        candidate = f"{base}-{n}"
    taken.append(candidate)
    del taken[:-KEEP]
    return candidate
