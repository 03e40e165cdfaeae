"""SGLang 0.5.16's watchdog lines (srt/utils/watchdog.py, cudacore_pyspy_dump_utils.py) as the parser reads them."""

from __future__ import annotations

from probes.sglang_watchdog import MAX_DUMP_LINES, SGLangWatchdogParser
from probes.types import LogLine


def lines(*texts: str) -> list[LogLine]:
    return [LogLine(seq=i + 1, at=float(i), stream="stderr", text=t) for i, t in enumerate(texts)]


DUMP = [
    "[2026-12-01 10:00:00 TP0] Pyspy dump for PID 4242 (py-spy dump --native --pid 4242):",
    "Process 4242: sglang::scheduler_TP0",
    "Python v3.12.3 (/usr/bin/python3.12)",
    "",
    'Thread 4242 (active+gil): "MainThread"',
    "    cudaEventSynchronize (libcudart.so.12)",
    "    synchronize (torch/cuda/streams.py:225)",
    "    forward (sglang/srt/model_executor/model_runner.py:2301)",
    'Thread 4250 (idle): "Thread-1"',
    "    wait (threading.py:331)",
]
FIRED = "[2026-12-01 10:00:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300.0, self.soft=False)"


def test_dump_then_timeout_line() -> None:
    p = SGLangWatchdogParser()
    p.feed(lines(*DUMP, "[2026-12-01 10:00:00 TP0] Decode batch, #running-req: 1", FIRED))
    fire = p.observe()
    assert fire is not None and fire.name == "Scheduler" and fire.timeout_s == 300.0 and not fire.soft
    assert fire.line.startswith("Scheduler watchdog timeout")
    ((pid, text),) = fire.dumps
    assert pid == 4242 and "synchronize (torch/cuda/streams.py:225)" in text
    assert "Decode batch" not in text  # the dump ends at the next prefixed line


def test_failed_py_spy_and_soft_watchdog() -> None:
    p = SGLangWatchdogParser()
    p.feed(
        lines(
            "[2026-12-01 10:00:00 TP0] Pyspy failed (py-spy dump --native --pid 7). "
            "Error: /bin/sh: 1: py-spy: not found"
        )
    )
    p.feed(lines("[2026-12-01 10:00:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=60.0, self.soft=True)"))
    soft = p.observe()
    assert soft is not None and soft.soft and soft.dumps == () and "py-spy: not found" in soft.dump_errors[0]
    p.feed(lines(FIRED))  # a hard one after a soft one replaces it
    hard = p.observe()
    assert hard is not None and not hard.soft and hard.timeout_s == 300.0


def test_nothing_fires_on_ordinary_lines_and_dumps_are_bounded() -> None:
    p = SGLangWatchdogParser()
    p.feed(lines("[2026-12-01 10:00:00] watchdog timeout mentioned in prose", "Scheduler watchdog timeout"))
    assert p.observe() is None
    p.feed(lines(DUMP[0], *(["    f (x.py:1)"] * (MAX_DUMP_LINES + 50)), FIRED))
    fire = p.observe()
    assert fire is not None and len(fire.dumps[0][1].splitlines()) == MAX_DUMP_LINES
