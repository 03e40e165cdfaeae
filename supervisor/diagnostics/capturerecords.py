"""The records that cross the diagnostics package's boundary: request, evidence, outcomes, result."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from probes.types import GpmObservation, GpuObservation, ProcInfo, ThreadInfo
from supervisor.status.causes import HangClass

if TYPE_CHECKING:
    from supervisor.diagnostics.frtrace import FrTraceJob

ToolName = Literal["py-spy", "py-spy-native", "gdb", "cuda-gdb", "pystack", "pystack-gil", "pystack-native"]
Outcome = Literal[
    "ok",  # the tool ran and produced a dump
    "missing",  # the tool is not installed (or the configured path does not exist)
    "denied",  # ptrace refused: no CAP_SYS_PTRACE, another uid, or yama ptrace_scope
    "timeout",  # killed after its time limit; partial output kept
    "gone",  # the process exited before or while the tool ran
    "skipped",  # not run because the request rules it out (e.g. --native with --nonblocking)
    "failed",  # any other non-zero exit or empty output
]

_ID_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def new_incident_id(wall: float, cause: str | None) -> str:
    """`20261129T144501Z-startup_stall`: UTC time first, so names sort in time order."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(wall))
    suffix = _ID_SAFE.sub("_", cause or "manual").strip("._-") or "manual"
    return f"{stamp}-{suffix}"


@dataclass(frozen=True)
class CaptureRequest:
    incident_id: str
    trigger: Literal["hung", "manual"]
    cause: str | None  # "startup_stall", "serving_stall", ... or None for a manual diagnose
    processes: tuple[ProcInfo, ...]  # every process of the tree
    py_spy: bool = True
    native: bool = False
    gdb: bool = False  # True only when hung or forced by the request: gdb stops the process
    nonblocking: bool = False  # py-spy --nonblocking: a healthy server that a person only asked about
    py_spy_timeout_s: float = 20.0
    gdb_timeout_s: float = 30.0
    # Every tool of the capture ends within this many seconds of the first one starting; each
    # tool's own timeout is cut to what is left, so a bundle never holds up the restart for long.
    budget_s: float = 20.0
    log_tail: tuple[str, ...] = ()
    rung: str = ""
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # redacted before writing
    phase: str | None = None
    verdict: Mapping[str, object] = field(default_factory=dict)  # JSON-able
    gpu: GpuObservation | None = None
    gpm: GpmObservation | None = None  # NVML GPM SM activity at the poll that judged the hang
    sglang_watchdog: str = ""  # SGLang's own watchdog fired: its timeout line ("" when it did not)
    sglang_dumps: tuple[tuple[int, str], ...] = ()  # (pid, py-spy text) that SGLang's watchdog logged
    tree_cpu_cores: float | None = None  # recent CPU rate of the tree
    gpu_util_percent: float | None = None
    busy_cpu_cores: float = 0.8  # [watchdog] busy_cpu_cores
    busy_gpu_percent: float = 50.0  # [watchdog] busy_gpu_percent
    created_at: float | None = None  # wall clock of the incident; None: now
    gpu_xids: tuple[Mapping[str, object], ...] = ()  # recent GPU faults (supervisor.daemon.xids.as_records)
    group: Mapping[str, object] | None = None  # multi-node: this node and the other nodes' bundles (supervisor/group)
    flight_recorder: bool = True  # write the ranks' FR pipes (where `env` has them) before the tools
    flight_recorder_wait_s: float = 5.0  # bounded wait for the dumps


@dataclass(frozen=True)
class ToolOutcome:
    pid: int
    tool: ToolName
    outcome: Outcome
    duration_s: float
    bytes: int = 0  # of the output as captured (before the size cap)
    exit_code: int | None = None
    file: str | None = None  # the file in the bundle holding the output
    detail: str = ""  # stderr tail or why it did not run
    truncated: bool = False  # output beyond the size cap was dropped


@dataclass(frozen=True)
class Frame:
    function: str
    file: str = ""  # Python: short file name; native: source file or library
    line: int | None = None

    @property
    def is_python(self) -> bool:
        return self.file.endswith(".py")

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@dataclass(frozen=True)
class StackThread:
    tid: int | None  # OS thread id where the tool names it
    name: str
    frames: tuple[Frame, ...]  # innermost first
    status: str = ""  # py-spy: "idle", "active", "active+gil", ...; gdb: ""


@dataclass(frozen=True)
class ProcEvidence:
    pid: int
    role: str = "other"
    rank: int | None = None
    title: str = ""
    samples: tuple[tuple[ThreadInfo, ...], ...] = ()  # successive /proc thread samples, oldest first
    python: tuple[StackThread, ...] = ()  # from py-spy (the native dump when one was taken)
    native: tuple[StackThread, ...] = ()  # from gdb or cuda-gdb
    gpu_kernels: tuple[str, ...] = ()  # from cuda-gdb `info cuda kernels`
    # State T before any tool attached: SIGSTOP (or a debugger of someone else's) holds it.
    stopped: bool = False
    cpu_cores: float | None = None  # its CPU rate over a short window before the tools ran

    @property
    def rank_like(self) -> bool:
        """A scheduler, or a child still importing that will be one: where the model's work runs."""
        return self.role in ("scheduler", "pending")

    @property
    def label(self) -> str:
        rank = f" TP{self.rank}" if self.rank is not None else ""
        return f"{self.role}{rank} pid {self.pid}"


@dataclass(frozen=True)
class Evidence:
    processes: tuple[ProcEvidence, ...]
    phase: str | None = None
    tree_cpu_cores: float | None = None
    gpu_util_percent: float | None = None
    busy_cpu_cores: float = 0.8
    busy_gpu_percent: float = 50.0


@dataclass(frozen=True)
class Classification:
    hang_class: HangClass
    reasons: tuple[str, ...]  # figures and findings, in words
    frames: tuple[str, ...]  # supporting frames: "scheduler TP0 pid 12: thread 'x' in f (file.py:3)"
    candidates: tuple[HangClass, ...] = ()  # every class whose rule matched, in precedence order


@dataclass(frozen=True)
class BundleResult:
    id: str
    path: Path | None  # None when the bundle could not be written
    hang_class: HangClass | None  # None: not captured as a hang (spec_regression, manual, on request)
    classification: Classification
    duration_s: float
    tools: tuple[ToolOutcome, ...]
    error: str | None  # why the write failed; the summary is still complete
    summary: dict[str, object]
    removed: tuple[str, ...] = ()  # older bundles deleted by retention
    fr_trace: FrTraceJob | None = None  # torch's FR analyzer, for the daemon to run after the bundle
