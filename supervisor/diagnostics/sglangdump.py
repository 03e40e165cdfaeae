"""SGLang's own watchdog dump in a bundle: the stacks SGLang took of itself before it killed its tree.

When the daemon's own tools find a scheduler gone (or could not read it), the py-spy pass SGLang's
watchdog logged is the only record of where it hung: it stands in for that process's Python stacks,
so the hang is classified from it, and it is kept whole in `sglang-watchdog.txt`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from supervisor.diagnostics.capturerecords import CaptureRequest, ProcEvidence
from supervisor.diagnostics.tools import parse_py_spy

FILE = "sglang-watchdog.txt"


def with_sglang_dumps(procs: Sequence[ProcEvidence], dumps: Sequence[tuple[int, str]]) -> list[ProcEvidence]:
    out = list(procs)
    for pid, text in dumps:
        threads = parse_py_spy(text)
        if not threads:
            continue
        at = next((i for i, p in enumerate(out) if p.pid == pid), None)
        if at is None:
            out.append(
                ProcEvidence(pid, "scheduler", None, "(gone; stacks from SGLang's watchdog dump)", python=threads)
            )
        elif not out[at].python:
            out[at] = replace(out[at], python=threads)
    return out


def sglang_files(req: CaptureRequest) -> dict[str, str]:
    if not req.sglang_watchdog:
        return {}
    parts = [req.sglang_watchdog, ""]
    for pid, text in req.sglang_dumps:
        parts += [f"== py-spy dump of pid {pid}, as SGLang's watchdog logged it ==", text, ""]
    if not req.sglang_dumps:
        parts.append("SGLang's watchdog logged no py-spy dump (py-spy missing in the server's environment?)")
    return {FILE: "\n".join(parts) + "\n"}
