"""summary.json (the documented schema, docs/DIAGNOSTICS.md) and summary.txt (for a person)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from probes.types import GpmObservation, GpuObservation, ProcInfo
from supervisor.common.redact import Redactor
from supervisor.diagnostics.capturerecords import CaptureRequest, Classification, Evidence, ToolOutcome
from supervisor.diagnostics.culprit import NONE_NAMED, Culprit
from supervisor.diagnostics.kernels import gpm_doc, gpm_lines, kernel_lines, resident
from supervisor.diagnostics.waits import ThreadView, thread_views

SCHEMA_VERSION = 1
_MAX_LINES_PER_PROCESS = 40
_ORDER = {"stopped": -1, "lock": 0, "disk": 1, "gpu": 2, "running": 3, "io": 4, "other": 5, "sleep": 6}


def iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


@dataclass(frozen=True)
class ProcRecord:
    info: ProcInfo
    alive: bool
    listening: tuple[str, ...]
    files: tuple[str, ...]
    threads: int  # seen in /proc at capture time


def _shown(views: Sequence[ThreadView]) -> list[ThreadView]:
    """Threads with a stack first by how telling their wait is; bare /proc threads only if nothing else."""
    with_stack = [v for v in views if v.python is not None or v.native is not None]
    chosen = with_stack or list(views)
    return sorted(chosen, key=lambda v: (v.background, _ORDER.get(v.kind, 9)))


def _wait_record(v: ThreadView) -> dict[str, object]:
    site = v.site
    return {
        "pid": v.pid,
        "tid": v.tid,
        "thread": v.name,
        "kind": v.kind,
        "waits_in": v.label,
        "state": v.state,
        "wchan": v.wchan,
        "function": site.function if site else None,
        "file": site.file if site else None,
        "line": site.line if site else None,
        "caller": f"{v.caller.where} ({v.caller.function})" if v.caller else None,
        "text": v.sentence(),
    }


def gpu_doc(gpu: GpuObservation | None, gpm: GpmObservation | None = None) -> dict[str, object]:
    if gpu is None:
        return {"status": "unavailable", "reason": "no NVML snapshot was given", "gpm": gpm_doc(gpm)}
    return asdict(gpu) | {"gpm": gpm_doc(gpm)}


def captured_for(req: CaptureRequest) -> str:
    """Why this bundle exists, in words. Only a capture of a hung server is a hang: a bundle taken for a
    speculative regression, a manual restart or on request says so instead of naming a hang shape."""
    why = str(req.verdict.get("reason", "") or "")
    tail = f": {why}" if why else ""
    if req.trigger == "hung":
        return f"judged hung ({req.cause or 'hung state'}){tail}"
    if req.cause is None:
        return "captured on request (diagnose): the server was not judged hung"
    if req.cause == "manual":
        return f"captured for a manual restart{tail}"
    return f"captured for {req.cause}{tail}"


def _wait_kinds(waits: Sequence[dict[str, object]]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for w in waits:
        kinds[str(w["kind"])] = kinds.get(str(w["kind"]), 0) + 1
    return dict(sorted(kinds.items()))


def build_summary(
    req: CaptureRequest,
    bundle_id: str,
    created_at: float,
    evidence: Evidence,
    classification: Classification,
    procs: Sequence[ProcRecord],
    tools: Sequence[ToolOutcome],
    durations: dict[str, float],
    errors: Sequence[str],
    files: Sequence[str],
    redactor: Redactor,
    culprits: Sequence[Culprit] = (),
) -> dict[str, object]:
    waits = [_wait_record(v) for p in evidence.processes for v in _shown(thread_views(p))]
    by_pid = {p.pid: p for p in evidence.processes}
    gpu = gpu_doc(req.gpu)
    hung = req.trigger == "hung"
    # A bundle of a server not judged hung carries no hang class: the findings stay, as evidence only.
    reasons = classification.reasons if hung else tuple(r for r in classification.reasons if "matched" not in r)
    summary: dict[str, object] = {
        "schema": SCHEMA_VERSION,
        "id": bundle_id,
        "created_at": iso(created_at),
        "trigger": req.trigger,
        "cause": req.cause,
        "why": str(req.verdict.get("reason", "") or ""),  # the verdict in words (a stopped log keeper named)
        "captured_for": captured_for(req),
        "hang_class": classification.hang_class if hung else None,
        # The thread that stopped progress, first: only a hang has one (issue 35).
        "culprit": culprits[0].doc() if hung and culprits else None,
        "culprits": [c.doc() for c in culprits] if hung else [],
        "reasons": list(reasons),
        "frames": list(classification.frames),
        "candidates": list(classification.candidates) if hung else [],
        "wait_kinds": _wait_kinds(waits),
        "rung": req.rung,
        "phase": req.phase,
        "argv": list(redactor.argv(req.argv)),
        "requested": {
            "py_spy": req.py_spy,
            "native": req.native,
            "gdb": req.gdb,
            "nonblocking": req.nonblocking,
        },
        "figures": {"tree_cpu_cores": evidence.tree_cpu_cores, "gpu_util_percent": evidence.gpu_util_percent},
        "stopped": [p.pid for p in evidence.processes if p.stopped],
        "pids": [
            {
                "pid": r.info.pid,
                "ppid": r.info.ppid,
                "role": r.info.role,
                "rank": r.info.rank,
                "title": r.info.title,
                "status": r.info.status,
                "stopped": r.info.pid in by_pid and by_pid[r.info.pid].stopped,
                "cpu_cores": by_pid[r.info.pid].cpu_cores if r.info.pid in by_pid else None,
                "alive": r.alive,
                "threads": r.threads or r.info.num_threads,
                "listening": list(r.listening),
                "files": list(r.files),
            }
            for r in procs
        ],
        "tools": [asdict(t) for t in tools],
        "waits": waits,
        "durations": durations,
        "nvml": {k: gpu[k] for k in ("status", "reason") if k in gpu}
        | {
            "devices": len(req.gpu.devices) if req.gpu else 0,
            "tree_mem_bytes": req.gpu.tree_mem_bytes if req.gpu else 0,
            "util_percent": {str(d.index): d.util_percent for d in req.gpu.devices} if req.gpu else {},
            "gpm": gpm_doc(req.gpm),
        },
        "gpu_kernels": resident(evidence, req.gpu),
        "sglang_watchdog": req.sglang_watchdog or None,
        "errors": list(errors),
        "files": sorted(files),
    }
    redacted = redactor.obj(summary)
    assert isinstance(redacted, dict)
    return redacted


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} kB" if n < 1024 * 1024 else f"{n / 1048576:.1f} MB"


def _trigger_label(s: dict[str, object]) -> str:
    """`hung`, `manual` (a person asked), or an incident that is not a hang (a speculative regression
    is captured with the manual capture's tools, but nobody asked for it)."""
    if s["trigger"] == "hung" or s["cause"] in (None, "manual"):
        return str(s["trigger"])
    return "not a hang"


def render_text(summary: dict[str, object], evidence: Evidence, redactor: Redactor) -> str:
    """One page that says which process, which thread, which line, then what was run and kept."""
    s = summary
    head = _culprit_head(s)
    lines = [
        *head,
        f"Incident {s['id']}: {_trigger_label(s)} (cause {s['cause'] or 'manual'}) at {s['created_at']}",
        *([f"Why: {s['why']}"] if s.get("why") else []),
        *(
            [f"Hang class: {s['hang_class']}"]
            if s["hang_class"] is not None
            else [f"Hang class: none (not a hang: {s['captured_for']})"]
        ),
        *[f"  - {r}" for r in _strs(s["reasons"])],
        *([] if s["hang_class"] is not None else [f"  - threads by wait kind (evidence, not a class): {_kinds(s)}"]),
        *(
            [f"SGLang's own watchdog fired: {s['sglang_watchdog']} (its dump: sglang-watchdog.txt)"]
            if s.get("sglang_watchdog")
            else []
        ),
        f"Rung: {s['rung'] or '?'}   Phase: {s['phase'] or '?'}",
        f"Command: {' '.join(_strs(s['argv'])) or '?'}",
        "",
        "Where each thread is (waits first; full stacks in pyspy-*, pystack-* and gdb-* files):",
    ]
    for proc in evidence.processes:
        views = thread_views(proc)
        shown = _shown(views)
        lines += [v.sentence() for v in shown[:_MAX_LINES_PER_PROCESS]]
        hidden = len(views) - min(len(shown), _MAX_LINES_PER_PROCESS)
        if hidden > 0:
            lines.append(f"{proc.label}: +{hidden} more threads (proc-{proc.pid}.txt)")
        if not views:
            lines.append(f"{proc.label}: no thread seen (process gone, or no tool could read it)")
    if s["frames"]:
        title = "Frames supporting the class:" if s["hang_class"] is not None else "Frames seen (evidence, no class):"
        lines += ["", title, *[f"  {f}" for f in _strs(s["frames"])]]
    lines += ["", "Processes:"]
    for p in _dicts(s["pids"]):
        rank = f" TP{p['rank']}" if p["rank"] is not None else ""
        listen = ", ".join(_strs(p["listening"])) or "no port"
        status = "STOPPED (state T before the capture, left stopped)" if p.get("stopped") else p["status"]
        cpu = f", {float(str(p['cpu_cores'])):.2f} cores" if p.get("cpu_cores") is not None else ""
        lines.append(
            f"  pid {p['pid']} {p['role']}{rank} '{p['title']}' {status}{cpu},"
            f" {p['threads']} thread{'' if p['threads'] == 1 else 's'}, {listen}"
        )
    lines += ["", "Tools:"]
    for t in _dicts(s["tools"]):
        out = f" -> {t['file']}" if t["file"] else ""
        detail = f" ({t['detail']})" if t["detail"] and t["outcome"] != "ok" else ""
        lines.append(
            f"  pid {t['pid']} {t['tool']}: {t['outcome']} in {float(str(t['duration_s'])):.2f} s,"
            f" {_size(int(str(t['bytes'])))}{out}{detail}"
        )
    if not s["tools"]:
        lines.append("  none run")
    nvml = s["nvml"]
    assert isinstance(nvml, dict)
    lines += ["", f"GPU (nvml.json): {nvml.get('status')} {nvml.get('reason') or ''}".rstrip()]
    lines += gpm_lines(nvml)
    kernels = _dicts(s.get("gpu_kernels"))
    if kernels:
        lines += ["GPU kernels resident (cuda-gdb) and the host frames waiting for them:", *kernel_lines(kernels)]
    dur = s["durations"]
    assert isinstance(dur, dict)
    lines.append("Durations: " + ", ".join(f"{k} {float(v):.2f} s" for k, v in dur.items()))
    errs = _strs(s["errors"])
    lines += ["", "Errors:" if errs else "Errors: none", *[f"  {e}" for e in errs]]
    lines += ["", "Files: " + ", ".join(_strs(s["files"]))]
    return redactor.text("\n".join(lines)) + "\n"


def _culprit_head(s: dict[str, object]) -> list[str]:
    """A hang's summary.txt starts with its culprit (the same text summary.json `culprits` holds)."""
    if s.get("hang_class") is None:
        return []
    docs = _dicts(s.get("culprits"))
    if not docs:
        return [NONE_NAMED, ""]
    first = docs[0]
    lines = [str(first["text"]), *[f"  because {w}" for w in _strs(first.get("evidence"))]]
    frames = _strs(first.get("frames"))
    if len(frames) > 1:
        lines.append("  frames: " + " <- ".join(frames))
    kinds = first.get("helper_kinds")
    kind_text = ", ".join(f"{k} {n}" for k, n in kinds.items()) if isinstance(kinds, dict) else ""
    n = first.get("helpers")
    lines.append(f"  {n} idle helper thread{'' if n == 1 else 's'} folded" + (f" ({kind_text})" if kind_text else ""))
    for c in docs[1:]:
        # "also": a front end or a detokenizer with evidence of its own (issue 51)
        who = "other rank" if c.get("rank") is not None else "also"
        lines.append(f"  {who}: {str(c['text']).removeprefix('Culprit: ')} ({c.get('helpers')} helpers folded)")
    return [*lines, ""]


def _kinds(s: dict[str, object]) -> str:
    kinds = s.get("wait_kinds")
    return (", ".join(f"{k} {n}" for k, n in kinds.items()) if isinstance(kinds, dict) else "") or "none seen"


def _strs(v: object) -> list[str]:
    return [str(x) for x in v] if isinstance(v, list) else []


def _dicts(v: object) -> list[dict[str, object]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []
