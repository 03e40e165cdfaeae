"""Run by the SERVER's Python, never imported by the daemon: reads Flight Recorder dumps and prints
them as JSON (issue 35).

The dumps are pickles written by torch (`TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>`). They are read here
with an unpickler that refuses every class (the dumps are dicts, lists, tuples, strings and
numbers), in a child process of the daemon, so that a hostile file cannot run code in the daemon.
Usage: `python -I frdump.py FILE...`; prints one JSON document on stdout. Standard library only.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import sys
from typing import Any

MAX_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 4000
_RANK = re.compile(r"(\d+)$")


class _Plain(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused class {module}.{name}: a Flight Recorder dump holds plain data")


def _pg(entry: dict[str, Any]) -> str:
    pg = entry.get("process_group")
    if isinstance(pg, list | tuple) and pg:
        return str(pg[0])
    return str(entry.get("pg_id", "?"))


def _entry(e: dict[str, Any]) -> dict[str, Any]:
    return {
        "pg": _pg(e),
        "seq": int(e.get("collective_seq_id") or 0),
        "p2p_seq": int(e.get("p2p_seq_id") or 0),
        "p2p": bool(e.get("is_p2p", False)),
        "name": str(e.get("profiling_name", "?")),
        "state": str(e.get("state", "?")),
        "sizes": str(e.get("input_sizes", ""))[:120],
    }


def read(path: str) -> dict[str, Any]:
    m = _RANK.search(path)
    out: dict[str, Any] = {"file": path, "rank": int(m.group(1)) if m else None}
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES} bytes")
        dump = _Plain(io.BytesIO(data)).load()
        if not isinstance(dump, dict):
            raise ValueError("not a dict")
        entries = dump.get("entries") or []
        out["version"] = str(dump.get("version", ""))
        out["entries"] = [_entry(e) for e in entries[-MAX_ENTRIES:] if isinstance(e, dict)]
        pgs = dump.get("pg_config") or {}
        out["pg_config"] = {str(k): str(v.get("ranks", "")) for k, v in pgs.items() if isinstance(v, dict)}
    except Exception as err:  # one bad file is reported, the others still read
        out["error"] = f"{type(err).__name__}: {err}"[:300]
    return out


def main(argv: list[str]) -> int:
    print(json.dumps({"dumps": [read(p) for p in argv]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
