"""Issue 22's lanes (`busyhang`, `clean3`) -> the "Real SGLang: busy hangs at start-up" section of
docs/BENCHMARKS.md, with a slim copy in bench/real/results/busy-h200.json. Called by report.py:

    python3 -m bench.real.report --busy OUT/results-work4.json    # store, then render every section
    python3 -m bench.real.report                                  # re-render (this section too, once stored)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.report import table

SLIM = Path(__file__).resolve().parent / "results" / "busy-h200.json"
SECTION = "real-sglang-busy"


def slim(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"versions": raw.get("versions")}
    hang = raw.get("busyhang")
    if hang:
        inc = dict(hang.get("hang") or {})
        for k in ("events", "bundle"):
            inc.pop(k, None)
        out["busyhang"] = {k: v for k, v in hang.items() if k not in ("timeline", "close", "hang")} | {"hang": inc}
    clean = raw.get("clean3")
    if clean:
        out["clean3"] = clean
    return out


def store(path: Path) -> None:
    doc = slim(json.loads(path.read_text()))
    SLIM.parent.mkdir(parents=True, exist_ok=True)
    SLIM.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def _r(v: Any, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v) if isinstance(v, (int, float)) else str(v)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{float(v) * 100:.2f} %"


def _readings_row(label: str, r: dict[str, Any], incidents: Any) -> list[str]:
    kinds = ", ".join(f"{k} x{n}" for k, n in (r.get("last_kinds") or {}).items()) or "none taken"
    return [
        label,
        _r(r.get("seconds"), "{:.1f} s"),
        _r(r.get("util_max"), "{:.0f} %"),
        _pct(r.get("sm_active_when_busy_max")),
        _pct(r.get("sm_active_max")),
        _r(r.get("gpm_spin_s_max"), "{:.1f} s"),
        kinds,
        str(incidents),
    ]


def section(doc: dict[str, Any]) -> str:
    lines = ["## Real SGLang: busy hangs at start-up (issue 22)", ""]
    v = doc.get("versions") or {}
    if v:
        lines += [
            f"Device: {v.get('nvidia_smi') or v.get('driver')}; torch {v.get('torch')}, sglang {v.get('sglang')}.",
            "",
        ]
    h = doc.get("busyhang")
    if h:
        inc = h.get("hang") or {}
        sim = " (REAL_SIMULATE: the simulator, not SGLang)" if h.get("simulated") else ""
        kernels = h.get("kernels") or []
        named = "; ".join(", ".join(k.get("kernels") or []) or "not named (no cuda-gdb)" for k in kernels) or "-"
        waits = "; ".join(str(k.get("host_wait")) for k in kernels if k.get("host_wait")) or "-"
        lines += [
            f"Lane `busyhang`{sim}: a never-ending kernel (`torch.cuda._sleep(1 << 62)`) launched in "
            "`EAGLEDraftCudaGraphRunner.capture_one_shape`, then `Event.synchronize`, on the base rung; "
            f"`startup_stall_s = {h.get('startup_stall_s')}`, poll {h.get('poll_interval_s')} s, "
            "`cpu_only_stall_s` the shipped 900 s.",
            "",
            table(
                ["measure", "result", "target"],
                [
                    [
                        "onset to verdict",
                        _r(inc.get("detect_s"), "{:.1f} s"),
                        f"{_r(h.get('target_s'), '{:.0f} s')} (window + 2 polls): "
                        + ("met" if h.get("within_target") else "NOT met"),
                    ],
                    [
                        "cause / class",
                        f"{inc.get('cause')} / {inc.get('hang_class')}",
                        "startup_stall / cuda_graph_capture",
                    ],
                    ["why", str(inc.get("detail")), "-"],
                    ["kernel named (cuda-gdb)", named, "named"],
                    ["host frame waiting", waits, "named"],
                    ["bundle", _r(inc.get("bundle_s"), "{:.1f} s"), "-"],
                    [
                        "relaunch",
                        f"{inc.get('relaunch_rung')} ready {_r(inc.get('time_to_ready_s'), '{:.0f} s')} after launch, "
                        f"{_r(inc.get('onset_to_ready_s'), '{:.0f} s')} after the onset",
                        "no-cuda-graph ready",
                    ],
                ],
            ),
            "",
        ]
    c = doc.get("clean3")
    rows: list[list[str]] = []
    if h:
        rows.append(_readings_row("the hang (onset to verdict)", h.get("hang_readings") or {}, 1))
    for run in (c or {}).get("runs", []):
        rows.append(
            _readings_row(
                f"clean start {run.get('run')}: capturing_graphs (ready in {_r(run.get('ready_s'), '{:.0f} s')})",
                run.get("capture_readings") or {},
                run.get("incidents_total"),
            )
        )
    if rows:
        sim = " (REAL_SIMULATE)" if c and c.get("simulated") else ""
        lines += [
            f"Lane `clean3`{sim}: the same start without the fault, default flags (piecewise CUDA graph on), "
            f"three runs: {c.get('incidents') if c else '-'} incidents. The rules' readings, the hang beside the "
            "legitimate capture and compile stretches (GPM from `/status` every 0.5 s; py-spy looks are taken "
            "only while CPU is the only channel moving):",
            "",
            table(
                [
                    "stretch",
                    "length",
                    "NVML util max",
                    "SM active max while util >= 50 %",
                    "SM active max",
                    "GPM spin held",
                    "py-spy looks",
                    "incidents",
                ],
                rows,
            ),
            "",
            "The margin: the spin rule needs utilisation >= 50 % with SM activity <= 2 % on every GPU of the tree "
            "for the whole window; a clean capture either keeps utilisation low or shows SM activity above the floor.",
        ]
    return "\n".join(lines) + "\n"


def render(write: Any) -> None:
    if SLIM.exists():
        write(SECTION, section(json.loads(SLIM.read_text())))
