"""The simulator's compiled-kernel cache, as torch inductor's FX graph cache behaves: the first
compilation of a graph costs its full time and writes an entry (a temporary file, then a rename)
under `$TORCHINDUCTOR_CACHE_DIR/fxgraph/`; a later launch that finds the entry loads it in a small
fraction of that time. Without the variable (inductor's default is a per-user directory under
/tmp), every launch compiles from nothing, which is what a relaunch on a fresh machine or in a fresh
container pays (issue 36)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

WARM_FRACTION = 0.05  # loading a cached graph against compiling it


def entry(env: Mapping[str, str], graph: str) -> Path | None:
    base = env.get("TORCHINDUCTOR_CACHE_DIR", "").strip()
    return Path(base) / "fxgraph" / f"sim-{graph}.bin" if base else None


def compile_seconds(env: Mapping[str, str], graph: str, cold_s: float) -> float:
    """How long compiling `graph` takes on this launch: the full time, or a load of the cached entry."""
    path = entry(env, graph)
    return cold_s * WARM_FRACTION if path is not None and path.is_file() else cold_s


def store(env: Mapping[str, str], graph: str, size: int = 64 * 1024) -> None:
    """Write the compiled graph's entry; a cache that cannot be written only costs the next launch."""
    path = entry(env, graph)
    if path is None or path.is_file():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(os.urandom(size))
        os.replace(tmp, path)
    except OSError:
        pass
