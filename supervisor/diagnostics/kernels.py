"""Name the kernel: which GPU kernel is resident in each process (cuda-gdb's `info cuda kernels`) and
which host frame waits for it (the thread whose innermost Python frame is a GPU wait), and what GPM
read on its GPUs. A busy-hang bundle's summary leads with these, so the engineer reads "kernel X on
GPU 0, waited for by the scheduler's MainThread in Event.synchronize" without opening a dump.
"""

from __future__ import annotations

from probes.types import BusyThread, GpmObservation, GpuObservation, PyFrame
from supervisor.diagnostics.capturerecords import Evidence, ProcEvidence, StackThread
from supervisor.policy.gpuwait import thread_kind, where


def _as_busy(pid: int, t: StackThread) -> BusyThread:
    py = tuple(PyFrame(f.function, f.file, f.line) for f in t.frames if f.is_python)
    return BusyThread(pid=pid, tid=t.tid, name=t.name, frames=py)


def host_wait(p: ProcEvidence) -> str:
    """The thread of `p` that waits on the GPU, as `pid N 'name' in func (file:line)`; "" if none."""
    for t in p.python:
        busy = _as_busy(p.pid, t)
        if busy.frames and thread_kind(busy) == "gpu_wait":
            return where(busy)
    return ""


def resident(ev: Evidence, gpu: GpuObservation | None) -> list[dict[str, object]]:
    """One record per process that cuda-gdb found kernels in, or whose host thread waits on the GPU."""
    on_gpu: dict[int, list[int]] = {}
    for proc in gpu.processes if gpu is not None else ():
        on_gpu.setdefault(proc.pid, []).append(proc.gpu_index)
    out: list[dict[str, object]] = []
    for p in ev.processes:
        waits = host_wait(p)
        if not p.gpu_kernels and not waits:
            continue
        out.append(
            {
                "pid": p.pid,
                "process": p.label,
                "gpus": sorted(set(on_gpu.get(p.pid, []))),
                "kernels": list(p.gpu_kernels),
                "host_wait": waits or None,
            }
        )
    return out


def gpm_doc(gpm: GpmObservation | None) -> dict[str, object]:
    if gpm is None:
        return {"status": "unavailable", "reason": "no GPM reading was given"}
    return {
        "status": gpm.status,
        "reason": gpm.reason,
        "devices": [
            {
                "index": d.index,
                "uuid": d.uuid,
                "sm_active_ratio": d.sm_active_ratio,
                "sm_occupancy_ratio": d.sm_occupancy_ratio,
            }
            for d in gpm.devices
        ],
    }


def kernel_lines(records: list[dict[str, object]]) -> list[str]:
    lines: list[str] = []
    for r in records:
        gpus = r.get("gpus") or []
        on = f" on GPU {', '.join(str(g) for g in gpus)}" if isinstance(gpus, list) and gpus else ""
        kernels = r.get("kernels") or []
        named = (
            ", ".join(str(k) for k in kernels) if isinstance(kernels, list) and kernels else "not named (no cuda-gdb)"
        )
        lines.append(f"  {r['process']}{on}: kernel {named}")
        if r.get("host_wait"):
            lines.append(f"    waited for by {r['host_wait']}")
    return lines


def gpm_lines(nvml: dict[object, object]) -> list[str]:
    gpm = nvml.get("gpm")
    if not isinstance(gpm, dict):
        return []
    if gpm.get("status") != "ok":
        return [f"GPM SM activity: unavailable ({gpm.get('reason') or '?'})"]
    util = nvml.get("util_percent") if isinstance(nvml.get("util_percent"), dict) else {}
    parts = []
    for d in [d for d in gpm.get("devices") or [] if isinstance(d, dict)]:
        u = util.get(str(d["index"])) if isinstance(util, dict) else None
        busy = f"util {float(str(u)):.0f} %, " if u is not None else ""
        parts.append(f"GPU {d['index']} {busy}SM activity {float(str(d['sm_active_ratio'])):.2%}")
    return ["GPM: " + ("; ".join(parts) or "no reading yet")]
