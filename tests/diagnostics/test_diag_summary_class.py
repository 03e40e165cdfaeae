"""Only hangs get hang classes: the summary writer on the same busy evidence, captured for a hang and
for causes that are not hangs (issue 32: a speculative regression filed as `busy_spin`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.types import ProcInfo, ThreadInfo
from supervisor.common.redact import Redactor
from supervisor.diagnostics import CaptureRequest, Evidence, ProcEvidence, classify
from supervisor.diagnostics.summary import ProcRecord, build_summary, render_text
from supervisor.diagnostics.tools import parse_py_spy

FIX = Path(__file__).parent / "fixtures"
BUSY = (ThreadInfo(6876, "python", "R", "0"),)
SPEC_WHY = "speculative acceptance length 1.10 under floor 1.50"


def busy_evidence() -> Evidence:
    proc = ProcEvidence(
        6876,
        "scheduler",
        0,
        "sglang::scheduler_TP0",
        (BUSY, BUSY),
        python=parse_py_spy((FIX / "busy-pyspy.txt").read_text()),
        cpu_cores=1.0,
    )
    return Evidence((proc,), phase="serving", tree_cpu_cores=1.0)


def summary_of(trigger: str, cause: str | None, why: str = "") -> tuple[dict[str, object], str]:
    ev = busy_evidence()
    info = ProcInfo(6876, 1, "sglang::scheduler_TP0", "running", "scheduler", 0, 1.0, 1, 0, 0, 1)
    req = CaptureRequest(
        incident_id="x",
        trigger=trigger,  # type: ignore[arg-type]
        cause=cause,
        processes=(info,),
        verdict={"reason": why} if why else {},
        phase="serving",
    )
    red = Redactor()
    cls = classify(ev)
    assert cls.hang_class == "busy_spin"  # the evidence itself is busy: only the trigger differs
    s = build_summary(req, "b", 0.0, ev, cls, [ProcRecord(info, True, (), (), 1)], [], {}, [], [], red)
    return s, render_text(s, ev, red)


def test_a_hang_bundle_keeps_its_class() -> None:
    s, text = summary_of("hung", "serving_stall", "no token moved for 10 s")
    assert s["hang_class"] == "busy_spin" and s["candidates"] == ["busy_spin"]
    assert s["captured_for"] == "judged hung (serving_stall): no token moved for 10 s"
    assert "Hang class: busy_spin" in text.splitlines() and "Frames supporting the class:" in text


@pytest.mark.parametrize(
    ("cause", "why", "said", "label"),
    [
        ("spec_regression", SPEC_WHY, f"captured for spec_regression: {SPEC_WHY}", "not a hang"),
        ("manual", "restart requested", "captured for a manual restart: restart requested", "manual"),
        (None, "", "captured on request (diagnose): the server was not judged hung", "manual"),
    ],
)
def test_a_bundle_not_captured_for_a_hang_has_no_class_and_says_why(
    cause: str | None, why: str, said: str, label: str
) -> None:
    s, text = summary_of("manual", cause, why)
    # Nobody asked for a speculative regression's bundle: its head does not say "manual".
    assert text.splitlines()[0].startswith(f"Incident b: {label} (cause {cause or 'manual'})"), text.splitlines()[0]
    assert s["hang_class"] is None and s["candidates"] == []
    assert s["captured_for"] == said
    assert "busy_spin" not in str(s["reasons"]) and "busy_spin" not in text
    # The evidence stays, as evidence: the looping thread and the figures, and the wait kinds.
    assert any("running Python code" in r for r in s["reasons"]), s["reasons"]  # type: ignore[attr-defined]
    assert s["wait_kinds"] == {"running": 1}
    assert f"Hang class: none (not a hang: {said})" in text
    assert "threads by wait kind (evidence, not a class): running 1" in text
    assert "Frames seen (evidence, no class):" in text and "supporting the class" not in text


def test_the_wait_kinds_are_counted_in_a_hang_bundle_too() -> None:
    s, _ = summary_of("hung", "startup_stall")
    assert s["wait_kinds"] == {"running": 1}
