"""torch's Flight Recorder analyzer over a written bundle's dumps, after the bundle (issue 35).

torch's `fr_trace` imports torch before it reads anything: 3 s and more on an idle GPU host, 6-11 s
on a loaded 2-core machine. Run beside the tools it either held the bundle (and the relaunch) up
for that long or, bounded at 3 s, never finished on a real GPU host (H100, 2026-12-06: "did not
finish within 3 s" in both hang bundles, whose other tools took 0.9 s). The summary's Flight
Recorder verdict never needed it: the daemon's own reading (`frdump.py` with the server's Python)
gives it. So the capture reads the dumps and writes the bundle, and the daemon then runs the
analyzer over the bundle's own copies of the dumps, in the background, and adds `fr-trace.txt` to
the bundle when it finishes (redacted like every text of the bundle). Nothing waits for it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from supervisor.diagnostics.flightrec import FrReport, analyze, server_python

AFTER_BUNDLE_TIMEOUT_S = 60.0  # import torch on a loaded host, then the analysis of 8 ranks' rings
TRACE_FILE = "fr-trace.txt"
_ENV_KEYS = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "HOME")
TraceOutcome = Literal[
    "written",  # fr-trace.txt holds the analyzer's output, or why it gave none
    "gone",  # the bundle was removed (retention, a person) before or while the analyzer ran
    "error",  # fr-trace.txt could not be written
]


@dataclass(frozen=True)
class FrTraceJob:
    bundle: Path  # the written bundle, holding fr-dump-rank<N>.pickle
    python: str  # the server's interpreter (its torch)
    ranks: tuple[int, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # the few variables the analyzer needs
    redact: Callable[[str], str] = str  # the bundle's redactor: the analyzer prints names and frames


@dataclass(frozen=True)
class FrTraceDone:
    outcome: TraceOutcome
    duration_s: float
    detail: str = ""


def trace_job(
    report: FrReport,
    bundle: Path | None,
    env: Mapping[str, str],
    rank_pids: Sequence[int],
    argv: Sequence[str],
    redact: Callable[[str], str],
) -> FrTraceJob | None:
    """The analyzer's job for a written bundle whose dumps every one read as plain data (the
    analyzer unpickles with pickle's full loader), or None when there is nothing to run it on."""
    if bundle is None or report.status != "ok" or report.analyzer or not report.dumps:
        return None
    if len(report.read) != len(report.dumps) or any(d.error for d in report.read):
        return None
    python = server_python(rank_pids, argv, env)
    if python is None:
        return None
    keep = {k: v for k, v in env.items() if k in _ENV_KEYS}
    return FrTraceJob(bundle, python, tuple(sorted(report.dumps)), keep, redact)


async def trace_into_bundle(job: FrTraceJob, timeout_s: float = AFTER_BUNDLE_TIMEOUT_S) -> FrTraceDone:
    """Run the analyzer over the bundle's dumps (copied first into a folder only the daemon writes)
    and write its output, or why it gave none, as the bundle's `fr-trace.txt`."""
    tic = time.monotonic()
    dumps = {r: str(job.bundle / f"fr-dump-rank{r}.pickle") for r in job.ranks}
    if not job.bundle.is_dir():
        return FrTraceDone("gone", 0.0, "the bundle was removed before the analyzer ran")
    _read, text, err = await analyze(job.python, dumps, job.env, timeout_s)
    # Redacting up to 64 KiB and writing it are the daemon's disk and CPU: off the event loop.
    done = await asyncio.to_thread(_write, job, text or err or "torch's analyzer printed nothing")
    took = round(time.monotonic() - tic, 3)
    if done is not None:
        return FrTraceDone(done[0], took, done[1])
    return FrTraceDone("written", took, "" if text else (err or "no output")[:300])


def _write(job: FrTraceJob, text: str) -> tuple[TraceOutcome, str] | None:
    """fr-trace.txt, redacted, put in place atomically; (outcome, why) when it could not be."""
    tmp = job.bundle / f".{TRACE_FILE}.tmp"
    try:
        tmp.write_text(job.redact(text))
        os.replace(tmp, job.bundle / TRACE_FILE)
    except FileNotFoundError:
        return "gone", "the bundle was removed while the analyzer ran"
    except OSError as e:
        return "error", f"{TRACE_FILE} not written: {e.strerror or e}"
    return None
