"""Frozen observation records: what each probe saw at one poll.

Probes observe and never decide; the watchdog reads these records and nothing else. Every
timestamp is a reading of the supervisor's injected monotonic clock (seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from probes.ras import RasReport

# "pending": a child of the main process that has not set its title yet (still importing SGLang).
Role = Literal["main", "scheduler", "detokenizer", "controller", "pending", "other"]

Phase = Literal[
    "spawning",  # launched, importing SGLang: no start-up line yet (progress: reads, RSS, CPU)
    "initializing",  # distributed init, before weights
    "loading_weights",  # target model weights
    "loading_draft",  # the EAGLE draft model's weights
    "allocating_kv",  # KV cache and memory pool
    "capturing_graphs",  # CUDA graph capture
    "warming_up",  # HTTP server up, warm-up request in flight
    "serving",  # the ready line was seen
]


@dataclass(frozen=True)
class LogLine:
    """One line of the server's output; a carriage-return progress update is a line of its own."""

    seq: int  # 1, 2, 3, ... since the launch
    at: float  # monotonic clock when it was read
    stream: Literal["stdout", "stderr"]
    text: str  # decoded with errors="replace", without the line terminator, possibly truncated


@dataclass(frozen=True)
class ThreadInfo:
    tid: int
    name: str
    state: str  # one letter from /proc/<pid>/task/<tid>/stat: R, S, D, Z, T, t, I
    wchan: str  # kernel wait channel ("futex_wait_queue", "0" when running, "" unreadable)


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    title: str  # cmdline joined (setproctitle names such as "sglang::scheduler_TP0" show here)
    status: str  # psutil status: "running", "sleeping", "disk-sleep", "zombie", "stopped", ...
    role: Role
    rank: int | None  # tensor-parallel rank for schedulers, else None
    cpu_time_s: float  # user + system, this process only
    rss_bytes: int
    read_chars: int  # /proc/<pid>/io rchar: every read() incl. page cache (0 when unreadable)
    write_chars: int  # /proc/<pid>/io wchar
    num_threads: int
    threads: tuple[ThreadInfo, ...] = ()
    sid: int = 0
    pgid: int = 0


@dataclass(frozen=True)
class TreeObservation:
    root_pid: int | None
    root_alive: bool
    root_exit: int | None  # exit code of the main process once reaped; -N for signal N
    processes: tuple[ProcInfo, ...]
    cpu_time_s: float  # summed over processes
    rss_bytes: int
    read_chars: int
    write_chars: int

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.processes)

    def by_role(self, role: Role) -> tuple[ProcInfo, ...]:
        return tuple(p for p in self.processes if p.role == role)


@dataclass(frozen=True)
class ListenSocket:
    pid: int
    host: str
    port: int


@dataclass(frozen=True)
class PortsObservation:
    listening: tuple[ListenSocket, ...]  # sockets in LISTEN owned by the tree
    server_port_accepts: bool  # a TCP connect to (host, port) succeeded
    # One of `listening` is the server port: this tree bound it, no one else. None: unknown, the
    # tree's descriptors could not be read at all (another user without ptrace rights, hidepid).
    server_port_owned: bool | None = False


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    unit: str  # "shards", "batches"
    label: str  # e.g. "Loading safetensors checkpoint shards"
    rate: float | None = None  # items per second as the bar shows it

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total > 0 else 0.0


@dataclass(frozen=True)
class DecodeStats:
    """The scheduler's periodic `Decode batch, ...` line."""

    at: float
    running_reqs: int
    queue_reqs: int
    gen_throughput: float
    accept_len: float | None


@dataclass(frozen=True)
class LogObservation:
    lines_total: int  # monotonic count of lines (CR updates count) since launch
    last_line_at: float | None  # of the last line that shows progress (not a waiting line)
    phase: Phase
    progress: Progress | None  # the current progress bar, if any
    ready_line_seen: bool
    errors: tuple[str, ...] = ()  # recent error lines (traceback tail, CUDA OOM, NCCL), newest last
    decode_lines_total: int = 0
    last_decode: DecodeStats | None = None
    health_failed_lines: int = 0  # "Health check failed." lines seen
    # Lines an engine repeats while it waits on something that may never come (vLLM's "No available
    # shared memory broadcast block found in 60 seconds"): output, but not progress.
    waiting_lines_total: int = 0

    @property
    def progress_lines(self) -> int:
        """Lines that count as start-up progress (the watchdog's `log` channel)."""
        return self.lines_total - self.waiting_lines_total


GpuStatus = Literal["ok", "unavailable"]


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    name: str
    util_percent: float
    mem_used_bytes: int
    mem_total_bytes: int
    power_w: float | None = None
    power_limit_w: float | None = None  # NVML's enforced power limit: the busy end of the power rule
    util_read: bool = True  # False: NVML gave no utilisation (a MIG slice, NOT_SUPPORTED); util_percent is 0 then


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    gpu_index: int
    uuid: str
    used_bytes: int


@dataclass(frozen=True)
class GpuObservation:
    status: GpuStatus
    reason: str  # why unavailable ("" when ok)
    devices: tuple[GpuDevice, ...] = ()
    processes: tuple[GpuProcess, ...] = ()  # only processes of the supervised tree

    @property
    def tree_mem_bytes(self) -> int:
        return sum(p.used_bytes for p in self.processes)

    @property
    def max_util_percent(self) -> float:
        return max((d.util_percent for d in self.devices), default=0.0)


@dataclass(frozen=True)
class HealthObservation:
    at: float  # when the probe finished
    ok: bool
    status_code: int | None
    latency_s: float
    error: str  # "" on success; "timeout", "connection refused", "HTTP 503", ...


@dataclass(frozen=True)
class SpecCounts:
    """An engine's speculative counters (vLLM: `spec_decode_num_drafts_total`, `..._accepted_tokens_total`)."""

    drafts: float
    accepted: float

    def accept_length_since(self, before: SpecCounts | None) -> float | None:
        """1 + accepted / drafts over the drafts since `before` (all of them without one); None when no
        draft happened in between (no reading, not a regression) or the counters went back (a restart)."""
        d0, a0 = (before.drafts, before.accepted) if before is not None else (0.0, 0.0)
        drafts, accepted = self.drafts - d0, self.accepted - a0
        if drafts <= 0 or accepted < 0:
            return None
        return 1.0 + accepted / drafts


@dataclass(frozen=True)
class ServingObservation:
    """The server's own /metrics (SGLang's with --enable-metrics; vLLM's always), scraped with a client
    timeout; names per engine in supervisor/engines."""

    at: float
    available: bool
    error: str = ""
    running_reqs: float | None = None
    queue_reqs: float | None = None
    generation_tokens_total: float | None = None
    # Tokens of engine steps: sglang:realtime_tokens_total{mode="decode"}, vllm:iteration_tokens_total's sum
    decode_tokens_total: float | None = None
    num_requests_total: float | None = None
    gen_throughput: float | None = None
    spec_accept_length: float | None = None
    active_requests: float | None = None  # sglang:http_requests_active on generation routes
    spec_counts: SpecCounts | None = None  # an engine's speculative counters, where it counts (vLLM)
    # Issue 51: the engine's admissions (its queue-time histogram's count) and first tokens (its
    # time-to-first-token histogram's count); None where the engine has no such family.
    started_total: float | None = None
    first_tokens_total: float | None = None


GpmStatus = Literal["ok", "unavailable"]


@dataclass(frozen=True)
class GpmDevice:
    """NVML GPU performance monitoring over the last poll interval (two samples, one device)."""

    index: int
    uuid: str
    sm_active_ratio: float  # NVML_GPM_METRIC_SM_UTIL / 100: share of SMs busy, 0..1
    sm_occupancy_ratio: float | None  # NVML_GPM_METRIC_SM_OCCUPANCY / 100: warps resident vs max


@dataclass(frozen=True)
class GpmObservation:
    status: GpmStatus
    reason: str  # why unavailable ("" when ok): older GPU, MIG, no permission, first sample pending
    devices: tuple[GpmDevice, ...] = ()


@dataclass(frozen=True)
class PyFrame:
    """One Python frame as py-spy names it, with its source line where the file could be read."""

    function: str
    file: str  # as py-spy prints it (--full-filenames: absolute where the module has a file)
    line: int | None
    code: str = ""  # the stripped source line, "" when unreadable


@dataclass(frozen=True)
class BusyThread:
    pid: int
    tid: int | None
    name: str
    frames: tuple[PyFrame, ...]  # innermost first, at most a few dozen


@dataclass(frozen=True)
class BusySample:
    """A Python-only, non-blocking py-spy look at the busy processes of the tree (one poll)."""

    at: float
    pids: tuple[int, ...]  # processes sampled (the ones burning CPU)
    threads: tuple[BusyThread, ...]  # threads py-spy reported active
    error: str = ""  # "" when every dump succeeded; else why not (py-spy missing, denied, timeout)
    duration_s: float = 0.0


@dataclass(frozen=True)
class SGLangWatchdogFire:
    """SGLang's own watchdog fired (probes/sglang_watchdog.py): its line, and the py-spy dumps it logged."""

    at: float  # when its timeout line was read
    name: str  # "Scheduler", "Detokenizer", ...
    timeout_s: float | None  # its --watchdog-timeout (or --soft-watchdog-timeout)
    soft: bool  # --soft-watchdog-timeout: it only dumped, nothing is killed
    line: str  # the timeout line, without its prefix
    dumps: tuple[tuple[int, str], ...] = ()  # (pid, the dump's log lines) in the order logged
    dump_errors: tuple[str, ...] = ()  # `Pyspy failed (...)` reasons (py-spy missing in the server's image)


@dataclass(frozen=True)
class SchedObservation:
    """The scheduler's view of the tree (probes/starvation.py): wanting a CPU versus getting one.

    Cumulative counters, summed over every thread of the tree read this poll; the watchdog takes
    differences between polls. A deadlocked tree (threads blocked on a futex or in a sleep) adds
    no run-queue wait however loaded the host is; a starved one adds up to a second per second per
    runnable thread.
    """

    available: bool  # at least one schedstat of the tree was read
    run_wait_s: float = 0.0  # /proc/<pid>/task/<tid>/schedstat field 2: runnable, waiting on a runqueue
    on_cpu_s: float = 0.0  # field 1: time spent running
    threads: int = 0  # threads whose schedstat was read
    psi_some_avg10: float | None = None  # host /proc/pressure/cpu `some avg10` (percent); None: absent
    psi_some_total_s: float | None = None  # host `some total`, seconds
    reason: str = ""  # why unavailable ("" when read)


@dataclass(frozen=True)
class Observation:
    at: float
    tree: TreeObservation
    ports: PortsObservation
    logs: LogObservation
    gpu: GpuObservation
    health: HealthObservation | None = None  # None when no probe finished this poll
    serving: ServingObservation | None = None
    gpm: GpmObservation = field(default_factory=lambda: GpmObservation(status="unavailable", reason="not probed"))
    busy: BusySample | None = None  # only on polls where the watchdog asked for a look
    sglang_watchdog: SGLangWatchdogFire | None = None  # SGLang's own watchdog fired in this launch
    sched: SchedObservation = field(default_factory=lambda: SchedObservation(available=False, reason="not probed"))
    loop_lag_s: float = 0.0  # how late the daemon's own poll started (actual - planned), seconds
    ras: RasReport | None = None  # an NCCL RAS report finished since the last poll (the RAS detector's input)
