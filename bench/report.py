"""Shared by the benchmarks: machine facts, a plain-text table, and one section of docs/BENCHMARKS.md.

Each benchmark owns one section between `<!-- section:NAME -->` and `<!-- /section:NAME -->`; writing
it replaces only that section, so benchmarks run on different machines (a CPU box, the H200) can fill
the same file.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "BENCHMARKS.md"
HEADER = "# Benchmarks\n\nWritten by the scripts in `bench/`; each section says how to reproduce it.\n"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        mem = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except Exception:  # pragma: no cover
        mem = "?"
    osname = f"{platform.system()} {platform.release()}"
    return f"{cpu}, {os.cpu_count()} cores, {mem}; {osname}; Python {sys.version.split()[0]}"


def versions(*tools: str) -> str:
    out = []
    for t in tools:
        try:
            v = subprocess.run([t, "--version"], capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
            out.append(v[0] if v else f"{t}: ?")
        except (OSError, subprocess.TimeoutExpired):
            out.append(f"{t}: not found")
    return "; ".join(out)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (also readable as plain text)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _fmt(c: object) -> str:
    if isinstance(c, float):
        return f"{c:.3f}" if abs(c) < 10 else f"{c:.1f}"
    return str(c)


def stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def write_section(name: str, body: str, path: Path = REPORT) -> None:
    begin, end = f"<!-- section:{name} -->", f"<!-- /section:{name} -->"
    text = path.read_text() if path.exists() else HEADER
    block = f"{begin}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
