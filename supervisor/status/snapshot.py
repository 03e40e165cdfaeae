"""What the supervisor publishes after every poll: the API and metrics read only this.

These are the JSON shapes of `GET /status` (DESIGN.md's contract: `state`, `phase`, `progress`,
`rung`, `pid`, `restarts`, `last_progress_s`, `last_incident`), frozen and replaced whole.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from probes.types import Phase
from supervisor.status.causes import Cause, HangClass
from supervisor.status.launchviews import LaunchTimelineView, OutageView, StallWindowView


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProgressView(_Frozen):
    done: int
    total: int
    unit: str
    label: str
    rate: float | None = None
    fraction: float


class IncidentView(_Frozen):
    id: str
    cause: Cause
    hang_class: HangClass | None = None  # once evidence classified it
    at: str  # ISO 8601 UTC
    rung: str
    detail: str = ""
    bundle: str | None = None  # diagnostics bundle id
    culprit: str | None = None  # the bundle's culprit line: the thread that stopped progress (issue 35)


class ServingView(_Frozen):
    health_ok: bool | None = None
    health_status: int | None = None
    health_latency_s: float | None = None
    health_error: str = ""
    health_failures_in_row: int = 0
    running_reqs: float | None = None
    queue_reqs: float | None = None
    token_rate: float | None = None  # generated tokens per second, from counters or the log
    spec_accept_length: float | None = None  # windowed mean
    metrics_available: bool = False
    # Staleness (issue 26): SGLang's gauges keep their last value when the scheduler stops.
    tokens_moved_s: float | None = None  # seconds since the generated-token counter last moved
    stale: bool = False  # requests running but no token for a while: running/queue are frozen figures


class GpuDeviceView(_Frozen):
    index: int
    uuid: str
    name: str
    util_percent: float
    mem_used_bytes: int
    mem_total_bytes: int
    tree_mem_bytes: int = 0  # held by the supervised tree on this GPU
    sm_active_ratio: float | None = None  # NVML GPM SM activity over the last poll, 0..1 (None: no GPM)
    sm_occupancy_ratio: float | None = None  # NVML GPM SM occupancy, 0..1


class GpuView(_Frozen):
    status: str  # "ok" | "unavailable"
    reason: str = ""
    devices: tuple[GpuDeviceView, ...] = ()
    tree_mem_bytes: int = 0
    gpm_status: str = "unavailable"  # "ok" | "unavailable": NVML GPU performance monitoring
    gpm_reason: str = ""  # why GPM is unavailable (older GPU, MIG, permission, no binding)


class BusyView(_Frozen):
    """While starting: is the CPU that moves working, or only waiting on the GPU (supervisor/policy/gpuwait.py)?"""

    looks: int = 0  # py-spy looks since strong progress last moved
    kinds: tuple[str, ...] = ()  # each look's finding: gpu_wait | compile | working | none | error
    waits_in: str = ""  # the frame a busy thread waited in at the last look
    threads: tuple[str, ...] = ()  # the last look's busy threads, "pid N 'name' in func (file:line)"
    error: str = ""  # why the last look saw nothing (py-spy missing, off, denied, timed out)
    look_s: float | None = None  # how long the last look took
    gpm_spin_s: float | None = None  # how long GPM has shown the tree's GPU busy with idle SMs


class ToolCheck(_Frozen):
    name: str  # "py-spy", "ptrace", "gdb", "cuda-gdb"
    ok: bool
    detail: str = ""
    # "capability": what this host's hardware can or cannot do (GPM, the busy signal): not ok is
    # "not available here", no fault to fix, with `instead` saying what the daemon uses instead.
    kind: Literal["tool", "capability"] = "tool"
    instead: str = ""


class ProcessView(_Frozen):
    pid: int
    role: str
    rank: int | None = None
    title: str
    status: str
    rss_bytes: int


class WriteErrorsView(_Frozen):
    """Failed writes of the daemon's own files since it started (disk full, read-only state_dir)."""

    journal: int = 0
    server_log: int = 0
    state: int = 0
    bundle: int = 0


class LogKeeperView(_Frozen):
    """The process that writes the server's output to logs/server.log (supervisor.logs.tending)."""

    pid: int | None = None
    condition: str = "none"  # running, stopped (does not read), replaced (at the last poll), lost, none
    replaced: int = 0  # keepers found dead and replaced on the same pipe since the daemon started
    pipe_bytes: int | None = None  # unread bytes in the server's output pipe
    pipe_size: int | None = None


class StopView(_Frozen):
    """The last stop of a server tree and what its verification found."""

    at: str  # ISO 8601 UTC
    survivors: int = 0  # processes of the tree still alive after SIGKILL
    port_free: bool = True
    gpu_released: str = "released"  # "released" | "held" | "unverified" (NVML could not answer)


class XidView(_Frozen):
    gpu: int  # NVML index (-1: the GPU no longer answers)
    uuid: str
    xid: int
    at: str  # ISO time the daemon read it
    action: str  # "restart" (application fault) or "reset_gpu" (unusable until reset)
    text: str


class GroupNodeView(_Frozen):
    """One node of a multi-node group as the leader (or, for itself, this daemon) sees it."""

    node: int
    address: str | None = None  # its daemon's API; None for this node
    reachable: bool = True
    unreachable_s: float = 0.0
    error: str = ""
    state: str | None = None  # its daemon's state (None: never reached)
    phase: str | None = None
    pid: int | None = None
    rung: str | None = None
    cause: str | None = None  # an incident it holds for the leader
    stopped_ranks: tuple[int, ...] = ()  # pids in state T
    incident: str | None = None  # the group incident it last captured for


class GroupView(_Frozen):
    """`/status` `group`: this daemon's role and, on the leader, every node (docs/MULTINODE.md)."""

    role: str  # "leader" | "worker"
    node_rank: int
    nnodes: int
    restart: str  # "daemon" | "lws"
    leader: str | None = None  # node 0's daemon API (workers)
    status: str = "ok"  # the leader's group verdict: "ok" | "degraded" | "incident"
    reason: str = ""
    serves: bool = False  # the leader: node 0 serves and no member that answers says otherwise
    nodes: tuple[GroupNodeView, ...] = ()


class NotifyView(_Frozen):
    """`/status` `notifications`: one `[[notify]]` target's deliveries since the daemon started."""

    target: str
    ok: int = 0
    failed: int = 0  # after its retries
    dropped: int = 0  # its queue overflowed
    last_error: str = ""
    last_failed_at: str | None = None
    last_ok_at: str | None = None


class StatusSnapshot(_Frozen):
    state: str  # State value
    phase: Phase | None = None  # while starting
    progress: ProgressView | None = None
    rung: str | None = None
    rung_index: int | None = None
    last_good_rung: str | None = None
    pid: int | None = None
    restarts: int = 0  # relaunches since the daemon started
    restarts_last_hour: int = 0
    last_progress_s: float | None = None  # seconds since any progress channel last moved
    channels_moved: tuple[str, ...] = ()  # channels that moved within the last poll window
    reason: str = ""  # why the state is what it is, in words
    since: str | None = None  # ISO time of the last state change
    state_age_s: float = 0.0
    started_at: str | None = None  # when the current server was launched
    time_to_ready_s: float | None = None  # of the current server, once ready
    next_attempt_in_s: float | None = None  # backoff remaining while restarting
    last_incident: IncidentView | None = None
    incidents: int = 0
    serving: ServingView = ServingView()
    gpu: GpuView = GpuView(status="unavailable", reason="not probed yet")
    busy: BusyView = BusyView()
    processes: tuple[ProcessView, ...] = ()
    selfcheck: tuple[ToolCheck, ...] = ()
    diagnosing: bool = False
    ladder: tuple[str, ...] = ()
    engine: str | None = None  # the current rung's engine ("sglang" | "vllm"; supervisor/engines)
    ladder_engines: tuple[str, ...] = ()  # each rung's engine, in `ladder` order: a ladder may cross engines
    version: str = ""
    loop_errors: int = 0  # exceptions the supervisor loop caught and survived
    write_errors: WriteErrorsView = WriteErrorsView()
    log_keeper: LogKeeperView | None = None  # while a server runs
    last_stop: StopView | None = None
    adopted: bool = False  # the server was started by an earlier daemon and taken over by this one
    takeover_s: float | None = None  # adoption to ready, for an adopted server (not its load time)
    gpu_xids: tuple[XidView, ...] = ()  # the last Xid events NVML reported, oldest first
    gpu_blocked: str | None = None  # a GPU of the server needs a reset: why nothing relaunches
    group: GroupView | None = None  # multi-node only ([group]); None for one node
    # issue 36 (supervisor/status/launchviews.py): the current or last launch's timeline, the start-up
    # stall window in force and why (while starting), the outage under way and the last one.
    launch_timeline: LaunchTimelineView | None = None
    stall_window: StallWindowView | None = None
    outage: OutageView | None = None
    last_outage: OutageView | None = None
    notifications: tuple[NotifyView, ...] = ()  # per [[notify]] target that delivered or failed (issue 38)
