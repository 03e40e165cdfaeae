"""Builds the `StatusSnapshot` the API and metrics read, from the supervisor's typed state."""

from __future__ import annotations

from dataclasses import dataclass

from probes.types import (
    BusySample,
    GpmObservation,
    GpuObservation,
    HealthObservation,
    Observation,
    ServingObservation,
    TreeObservation,
)
from supervisor.clock import iso
from supervisor.config.settings import Settings
from supervisor.daemon.observe import Observer
from supervisor.daemon.persist import InHand
from supervisor.daemon.server import Server
from supervisor.engines import profile_of
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.policy.gpuwait import where
from supervisor.policy.ladder import LadderState
from supervisor.policy.lifecycle import RUNNING, SERVING, Lifecycle, Pending, State
from supervisor.policy.watchdog import History, mean_accept
from supervisor.status.snapshot import (
    BusyView,
    GpuDeviceView,
    GpuView,
    IncidentView,
    LogKeeperView,
    ProcessView,
    ProgressView,
    ServingView,
    StatusSnapshot,
    StopView,
    ToolCheck,
    WriteErrorsView,
)


def gpu_view(gpu: GpuObservation | None, gpm: GpmObservation | None = None) -> GpuView:
    if gpu is None:
        return GpuView(status="unavailable", reason="not probed yet")
    sm = {d.index: d for d in gpm.devices} if gpm is not None else {}
    held: dict[int, int] = {}
    for p in gpu.processes:
        held[p.gpu_index] = held.get(p.gpu_index, 0) + p.used_bytes
    return GpuView(
        status=gpu.status,
        reason=gpu.reason,
        devices=tuple(
            GpuDeviceView(
                index=d.index,
                uuid=d.uuid,
                name=d.name,
                util_percent=d.util_percent,
                mem_used_bytes=d.mem_used_bytes,
                mem_total_bytes=d.mem_total_bytes,
                tree_mem_bytes=held.get(d.index, 0),
                sm_active_ratio=sm[d.index].sm_active_ratio if d.index in sm else None,
                sm_occupancy_ratio=sm[d.index].sm_occupancy_ratio if d.index in sm else None,
            )
            for d in gpu.devices
        ),
        tree_mem_bytes=gpu.tree_mem_bytes,
        gpm_status=gpm.status if gpm is not None else "unavailable",
        gpm_reason=gpm.reason if gpm is not None else "not probed yet",
    )


def busy_view(h: History | None, last: BusySample | None, now: float) -> BusyView:
    if h is None or h.ready_at is not None:  # a start-up reading: nothing to say once serving
        return BusyView()
    b = h.busy
    fresh = last if last is not None and last.at >= h.launched_at else None
    return BusyView(
        looks=len(b.kinds),
        kinds=b.kinds,
        waits_in=b.waits_in,
        threads=tuple(where(t) for t in fresh.threads[:8]) if fresh is not None else (),
        error=fresh.error if fresh is not None else "",
        look_s=fresh.duration_s if fresh is not None else None,
        gpm_spin_s=round(now - b.spin_since, 3) if b.spin_since is not None else None,
    )


def process_views(tree: TreeObservation | None) -> tuple[ProcessView, ...]:
    if tree is None:
        return ()
    return tuple(
        ProcessView(pid=p.pid, role=p.role, rank=p.rank, title=p.title[:200], status=p.status, rss_bytes=p.rss_bytes)
        for p in tree.processes
    )


@dataclass(frozen=True)
class Facts:
    """Everything the snapshot is built from, gathered by the supervisor."""

    state: str
    reason: str
    since_wall: float
    state_age_s: float
    rung: str | None
    rung_index: int | None
    last_good: str | None
    ladder: tuple[str, ...]
    engine: str  # the current rung's engine
    ladder_engines: tuple[str, ...]  # each rung's engine, in ladder order
    pid: int | None
    restarts: int
    restarts_last_hour: int
    started_wall: float | None
    time_to_ready_s: float | None
    next_attempt_in_s: float | None
    last_incident: IncidentView | None
    incidents: int
    selfcheck: tuple[ToolCheck, ...]
    diagnosing: bool
    version: str
    now: float
    history: History | None
    observation: Observation | None
    health: HealthObservation | None  # the latest answers, which most polls do not carry
    serving: ServingObservation | None
    running: bool  # a server tree is up (starting or serving)
    loop_errors: int = 0
    write_errors: WriteErrorsView | None = None
    log_keeper: LogKeeperView | None = None
    last_stop: StopView | None = None
    adopted: bool = False
    takeover_s: float | None = None
    stale_after_s: float = 10.0  # tokens still this long with requests running: the gauges are frozen
    busy: BusySample | None = None  # the latest py-spy look at the busy threads (not every poll has one)


def _current(at: float, ok: bool, h: History | None) -> bool:
    """Whether an HTTP answer describes the server as it is now.

    Answers from before this launch belong to the previous server; a failure from before ready
    (SGLang answers 503 while it warms up) says nothing about the server once it serves.
    """
    if h is None or at < h.launched_at:
        return False
    return ok or h.ready_at is None or at >= h.ready_at


def stale_after(metrics_interval_s: float, serving_stall_s: float) -> float:
    """Two scrapes, or a quarter of the stall window, without a token while requests wait: the
    gauges are shown as frozen figures, well before the serving_stall verdict."""
    return max(2 * metrics_interval_s, serving_stall_s / 4)


def token_staleness(
    h: History | None, sv: ServingObservation | None, now: float, stale_after_s: float
) -> tuple[float | None, bool]:
    """(seconds since the token counter moved, whether the serving gauges are frozen figures)."""
    if h is None or h.tokens_moved_at is None:
        return None, False
    moved_s = round(max(0.0, now - h.tokens_moved_at), 3)
    busy = (
        sv is not None
        and sv.available
        and (sv.running_reqs or 0) + (sv.queue_reqs or 0) + (sv.active_requests or 0) > 0
    )
    return moved_s, busy and moved_s > stale_after_s


def gather(
    *,
    now: float,
    wall: float,
    lifecycle: Lifecycle,
    reason: str,
    since_wall: float,
    settings: Settings,
    ladder: LadderState,
    server: Server,
    counters: Counters,
    inhand: InHand,
    pending: Pending | None,
    observer: Observer,
    selfcheck: tuple[ToolCheck, ...],
    write_errors: WriteErrorsView,
    last_stop: StopView | None,
    version: str,
) -> Facts:
    """The snapshot's facts, read from the owner's records as they stand (nothing is kept here)."""
    st = lifecycle.state
    running = st in RUNNING or st in (State.HUNG, State.DIAGNOSING)
    nxt = round(max(0.0, pending.at - now), 3) if pending is not None and st == pending.waits_in else None
    names = tuple(r.name for r in settings.ladder)
    current = settings.ladder[min(ladder.current, len(names) - 1)]
    good = ladder.last_good
    wd = settings.watchdog
    return Facts(
        state=st.value,
        reason=reason,
        since_wall=since_wall,
        state_age_s=now - lifecycle.since,
        rung=current.name,
        rung_index=ladder.current,
        last_good=names[good] if good is not None and good < len(names) else None,
        ladder=names,
        engine=profile_of(settings.engine_of(current)).name,
        ladder_engines=tuple(settings.engine_of(r) for r in settings.ladder),
        pid=server.pid,
        restarts=counters.restarts,
        restarts_last_hour=ladder.restarts_within_hour(wall),
        started_wall=server.launched_wall,
        time_to_ready_s=server.time_to_ready_s if st in SERVING else None,
        next_attempt_in_s=nxt,
        last_incident=inhand.last_incident,
        incidents=counters.incidents,
        selfcheck=selfcheck,
        diagnosing=inhand.diagnosing,
        version=version,
        now=now,
        history=server.history,
        observation=server.obs,
        health=observer.last_health,
        serving=observer.last_serving,
        running=running,
        loop_errors=counters.loop_errors,
        write_errors=write_errors,
        log_keeper=server.keeper_view(counters.keepers_replaced),
        last_stop=last_stop,
        adopted=server.adopted and running,
        takeover_s=server.takeover_s if st in SERVING else None,
        stale_after_s=stale_after(wd.metrics_interval_s, wd.serving_stall_s),
        busy=observer.last_busy,
    )


def build(f: Facts) -> StatusSnapshot:
    obs = f.observation if f.running else None
    h = f.history if f.running else None
    progress = None
    phase = None
    if obs is not None:
        phase = obs.logs.phase
        p = obs.logs.progress
        if p is not None:
            progress = ProgressView(
                done=p.done, total=p.total, unit=p.unit, label=p.label, rate=p.rate, fraction=round(p.fraction, 4)
            )
    moved: tuple[str, ...] = ()
    last_progress_s = None
    serving_now = f.state in ("ready", "degraded")
    if h is not None and not serving_now:  # start-up progress; a serving server has tokens instead
        last_progress_s = round(max(0.0, f.now - h.last_any_progress_at), 3)
    if h is not None:
        window = 3 * (obs.at - h.base.at if obs is not None else 0.0) + 1e-9
        moved = tuple(sorted(c for c, t in h.moved_at.items() if f.now - t <= max(window, 5.0)))
    serving = ServingView()
    if obs is not None:
        hv = f.health if f.health is not None and _current(f.health.at, f.health.ok, h) else None
        sv = f.serving if f.serving is not None and _current(f.serving.at, True, h) else None
        moved_s, stale = token_staleness(h, sv, f.now, f.stale_after_s)
        serving = ServingView(
            health_ok=hv.ok if hv is not None else None,
            health_status=hv.status_code if hv is not None else None,
            health_latency_s=round(hv.latency_s, 4) if hv is not None else None,
            health_error=hv.error if hv is not None else "",
            health_failures_in_row=h.health_failures if h is not None else 0,
            running_reqs=sv.running_reqs if sv is not None and sv.available else None,
            queue_reqs=sv.queue_reqs if sv is not None and sv.available else None,
            token_rate=None
            if stale
            else (sv.gen_throughput if sv is not None and sv.available else None)
            or (obs.logs.last_decode.gen_throughput if obs.logs.last_decode is not None else None),
            spec_accept_length=mean_accept(h) if h is not None else None,
            metrics_available=bool(sv is not None and sv.available),
            tokens_moved_s=moved_s,
            stale=stale,
        )
    return StatusSnapshot(
        state=f.state,
        phase="serving" if serving_now and obs is not None else phase,  # an adopted server saw no ready line
        progress=progress,
        rung=f.rung,
        rung_index=f.rung_index,
        last_good_rung=f.last_good,
        pid=f.pid,
        restarts=f.restarts,
        restarts_last_hour=f.restarts_last_hour,
        last_progress_s=last_progress_s,
        channels_moved=moved,
        reason=f.reason,
        since=iso(f.since_wall),
        state_age_s=round(f.state_age_s, 3),
        started_at=iso(f.started_wall),
        time_to_ready_s=f.time_to_ready_s,
        next_attempt_in_s=f.next_attempt_in_s,
        last_incident=f.last_incident,
        incidents=f.incidents,
        serving=serving,
        gpu=gpu_view(
            f.observation.gpu if f.observation is not None else None,
            f.observation.gpm if f.observation is not None else None,
        ),
        busy=busy_view(h, f.busy, f.now),
        processes=process_views(obs.tree if obs is not None else None),
        selfcheck=f.selfcheck,
        diagnosing=f.diagnosing,
        ladder=f.ladder,
        engine=f.engine,
        ladder_engines=f.ladder_engines,
        version=f.version,
        loop_errors=f.loop_errors,
        write_errors=f.write_errors or WriteErrorsView(),
        log_keeper=f.log_keeper,
        last_stop=f.last_stop,
        adopted=f.adopted,
        takeover_s=f.takeover_s,
    )


@dataclass
class Counters:
    """Counts for /status and /metrics; each grows only in the owner."""

    incidents: int = 0
    restarts: int = 0
    loop_errors: int = 0
    port_refusals: int = 0  # launches refused in a row because the port was held
    gpu_refusals: int = 0  # ... because a stranger held GPU memory (supervisor.daemon.slate)
    unknown_observations: int = 0
    state_write_errors: int = 0
    keepers_replaced: int = 0


class WriteTally:
    """Write errors for /status and the metrics counter alike: the counts live in their writers
    (journal, log keeper, state, bundles); each publish feeds the counter what grew since the last."""

    def __init__(self, metrics: SupervisorMetrics) -> None:
        self.metrics = metrics
        self.counted = WriteErrorsView()  # what the metrics counter has been told

    @staticmethod
    def view(journal: int, server_log: int, state: int, bundle: int) -> WriteErrorsView:
        return WriteErrorsView(journal=journal, server_log=server_log, state=state, bundle=bundle)

    def count(self, now: WriteErrorsView) -> None:
        before = self.counted
        for what in ("journal", "server_log", "state", "bundle"):
            self.metrics.write_error(what, getattr(now, what) - getattr(before, what))
        self.counted = now
