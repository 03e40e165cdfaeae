"""Verdicts from progress, never from a fixed timer.

`assess(history, observation, now, settings, ...)` is a pure function: no I/O, no clock reads, no
logging. It returns the verdict and the history to pass to the next call. While the server starts,
every channel the probes read is a progress signal; a stall is judged only when none moved for the
stall window. While it serves: health, token progress, ranks and speculative acceptance.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from probes.types import Observation, Phase
from supervisor.config.settings import WatchdogSettings
from supervisor.policy.admission import Admissions, admissions, never_started
from supervisor.policy.admission import figures as admission_figures
from supervisor.policy.admission import moved as admissions_moved
from supervisor.policy.gpuwait import NEUTRAL, BusyState, busy_figures, fold_busy, gpu_bound, gpu_spinning
from supervisor.policy.rasrule import RasState, RasVerdict
from supervisor.policy.sglangwd import cause_for, crash_error, dump_class, fired, reason
from supervisor.policy.stopped import held_stopped, stopped_members
from supervisor.status.causes import Cause

Mode = Literal["starting", "serving"]
Status = Literal["starting", "ready", "degraded", "incident"]
# "starved": the tree spent most of its quiet time runnable but waiting for a CPU (neither spinning
# nor blocked); the host, not the server, is the first suspect.
StallClass = Literal["idle", "busy", "starved"]

# Starvation extends a stall window by at most this many windows, so a tree that keeps waiting for
# a CPU (or a deadlocked one beside a spinning helper thread on a busy host) is still judged.
STARVED_CEILING_WINDOWS = 4.0
# Below these a poll's wait is jitter, not starvation: a blocked tree's heartbeat threads wait a few
# milliseconds for a CPU at each wake-up on a busy host, and a tick that overruns its interval a
# little starts the next one late. Counting such crumbs would move every verdict a poll later
# (issue 32's first cut made the serving stall 1 s late under the benchmark's load).
STARVED_MIN_SHARE = 0.1  # of the poll's wall time spent waiting for a CPU
LATE_MIN_POLLS = 0.5  # of a poll interval the daemon's own poll started late
# A gap between two polls beyond the larger of these is time the daemon did not watch: its clock
# jumped, or it (or its host) was stopped. No window counts it against the server (issue 50: a +1 h
# jump of the clock during a start tripped the 3,600 s backstop at once). A slow poll on a loaded host
# takes a few seconds, not ten intervals (20 s at the default 2 s).
UNWATCHED_MIN_S = 5.0
UNWATCHED_POLLS = 10.0

# Progress channels while starting. "cpu" alone is weak evidence: a spinning collective burns
# CPU too, so CPU-only movement postpones a stall verdict only up to `cpu_only_stall_s`.
CHANNELS = ("log", "progress", "phase", "cpu", "io", "rss", "gpu_mem", "port")
STRONG_CHANNELS = tuple(c for c in CHANNELS if c != "cpu")
LOG_CHANNELS = frozenset({"log", "progress", "phase"})


@dataclass(frozen=True)
class Baseline:
    """Readings at the previous poll (rates) or at the channel's last movement (levels)."""

    at: float
    lines_total: int = 0  # of lines that show progress (LogObservation.progress_lines)
    phase: str = "spawning"
    progress_key: tuple[str, int] | None = None
    cpu_time_s: float = 0.0
    io_chars: int = 0
    rss_ref: int = 0  # RSS when the rss channel last moved
    gpu_mem_ref: int = 0  # tree GPU memory when the gpu_mem channel last moved
    ports: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Starved:
    """Time the watch could not count against the server since its last progress (issue 32).

    `waited_s`: the tree wanted a CPU it did not get (issue 51: wanted, unused CPU only): the increase
    of its summed run-queue wait beyond the increase of its own on-CPU time, clamped to the wall time
    between the two polls. Threads of one tree that queue behind each other (a spinning rank's wait
    behind its own threads) wait about as long as the tree runs: that is the tree using its CPU, not
    the host withholding it. A poll in which the tree still ran at least `cpu_progress_cores` adds no
    wait: it had CPU to progress with, and the cpu-only rule already judges CPU-only movement. A poll
    in which the tree is seen to spin (`spinning`: a GPU busy with no SM work, a GPU busy at idle power,
    py-spy's looks in a GPU wait) adds none either: a tree that is runnable because it spins is not
    starved, and its wait is kept apart in `spun_s`. `late_s`: the daemon's own poll started late (its
    loop lag), clamped to what is left of that wall time.
    """

    waited_s: float = 0.0
    late_s: float = 0.0
    wait_ref: float | None = None  # the tree's summed run-queue wait at the previous poll
    cpu_ref: float | None = None  # its summed on-CPU time then
    at: float | None = None  # that poll's time
    spun_s: float = 0.0  # run-queue wait while the tree spun: not credited
    unwatched_s: float = 0.0  # poll gaps the daemon did not watch (`unwatched`): not counted, no ceiling

    @property
    def total_s(self) -> float:
        return self.waited_s + self.late_s

    def reset(self) -> Starved:
        return replace(self, waited_s=0.0, late_s=0.0, spun_s=0.0, unwatched_s=0.0)


def unwatched(dt: float, s: WatchdogSettings) -> float:
    """The part of a gap between two polls (monotonic seconds) that the daemon did not watch."""
    return max(0.0, dt - max(UNWATCHED_MIN_S, UNWATCHED_POLLS * s.poll_interval_s))


def _starved_step(
    st: Starved, obs: Observation, s: WatchdogSettings, *, spinning: bool = False, gap: float | None = None
) -> Starved:
    """Fold one poll's wanted, unused CPU and loop lag into the accumulated starved time (each only
    when it is more than jitter: `STARVED_MIN_SHARE`, `LATE_MIN_POLLS`), and the poll's unwatched gap
    (`gap`, else from the time since the previous poll) apart from them."""
    raw = max(0.0, obs.at - st.at) if st.at is not None else 0.0
    if gap is None:
        gap = unwatched(raw, s)
    dt = max(0.0, raw - gap)
    sched = obs.sched
    wait = spun = 0.0
    wait_ref, cpu_ref = st.wait_ref, st.cpu_ref
    if sched.available:
        if wait_ref is not None and cpu_ref is not None and dt > 0:
            # A member that exited takes its counters with it: a drop is no negative wait.
            ran_s = max(0.0, sched.on_cpu_s - cpu_ref)
            if ran_s / dt < s.cpu_progress_cores:
                wait = min(dt, max(0.0, sched.run_wait_s - wait_ref - ran_s))
                if wait < STARVED_MIN_SHARE * dt:
                    wait = 0.0
            if spinning:
                wait, spun = 0.0, wait
        wait_ref, cpu_ref = sched.run_wait_s, sched.on_cpu_s
    lag = max(0.0, obs.loop_lag_s - gap)
    late = min(max(0.0, dt - wait), lag) if lag >= LATE_MIN_POLLS * s.poll_interval_s else 0.0
    return Starved(
        st.waited_s + wait,
        st.late_s + late,
        wait_ref=wait_ref,
        cpu_ref=cpu_ref,
        at=obs.at,
        spun_s=st.spun_s + spun,
        unwatched_s=st.unwatched_s + gap,
    )


def spins(b: BusyState | None, obs: Observation, s: WatchdogSettings) -> bool:
    """The tree is seen spinning at this poll: its GPU busy with almost no SM work (GPM), or busy at
    about its idle power, or the last py-spy look that saw a busy thread found it in a GPU wait."""
    if gpu_spinning(obs.gpu, obs.gpm, s.busy_gpu_percent, s.gpm_spin_sm_active):
        return True
    if b is None:
        return False
    looks = [k for k in b.kinds if k not in NEUTRAL]
    return b.power_since is not None or (bool(looks) and looks[-1] == "gpu_wait")


def extension(st: Starved, window_s: float) -> float:
    """Seconds a stall window is extended: the starved time, at most `STARVED_CEILING_WINDOWS` windows."""
    return min(st.total_s, STARVED_CEILING_WINDOWS * window_s)


def extended_why(st: Starved, window_s: float) -> str:
    """The sentence a verdict carries when starvation extended its window, or time the daemon did not
    watch was left out of it ("" when neither)."""
    ext = extension(st, window_s)
    blind = f"{st.unwatched_s:.0f} s the daemon did not watch not counted (its clock jumped, or it was stopped)"
    if ext <= 0.05:
        return blind if st.unwatched_s > 0.05 else ""
    parts = []
    if st.waited_s > 0.05:
        parts.append(f"the tree waited {st.waited_s:.1f} s for a CPU")
    if st.late_s > 0.05:
        parts.append(f"the daemon's own poll was {st.late_s:.1f} s late")
    why = f"window extended by {ext:.1f} s: " + " and ".join(parts)
    if ext < st.total_s:
        why += f" (capped at {STARVED_CEILING_WINDOWS:g} windows)"
    return f"{why}; {blind}" if st.unwatched_s > 0.05 else why


@dataclass(frozen=True)
class History:
    launched_at: float
    base: Baseline
    moved_at: Mapping[str, float] = field(default_factory=dict)  # channel -> last time it moved
    cpu_rate: float = 0.0  # cores, over the last poll
    # serving
    ready_at: float | None = None
    ranks: frozenset[int] = frozenset()  # scheduler/detokenizer pids seen while serving
    health_failures: int = 0
    health_failing_since: float | None = None  # the first failed check of the run in a row
    health_seen: int = 0
    tokens: float | None = None
    tokens_moved_at: float | None = None  # when tokens or admissions last moved (the scheduler's counters)
    admitted: Admissions = field(default_factory=Admissions)  # at the last scrape (policy/admission.py)
    accept_samples: tuple[tuple[float, float], ...] = ()
    decode_at: float | None = None  # time of the last `Decode batch` line already sampled
    busy: BusyState = field(default_factory=BusyState)  # GPM and py-spy looks while starting (policy/gpuwait.py)
    ras: RasState = field(default_factory=RasState)  # NCCL RAS reports (policy/rasrule.py, issue 35)
    starved: Starved = field(default_factory=Starved)  # since the last progress (starting) or token (serving)
    # pid -> the poll that first saw it stopped (state T), for the processes stopped at every poll since
    stopped_since: Mapping[int, float] = field(default_factory=dict)
    unwatched_s: float = 0.0  # since the launch, the poll gaps the daemon did not watch (`unwatched`)

    def watched_since_launch(self, now: float) -> float:
        """Monotonic seconds since the launch that the daemon watched: what the backstop counts."""
        return now - self.launched_at - self.unwatched_s

    @property
    def last_progress_at(self) -> float:
        strong = [self.moved_at[c] for c in STRONG_CHANNELS if c in self.moved_at]
        return max([self.launched_at, *strong])

    @property
    def last_any_progress_at(self) -> float:
        return max([self.launched_at, *self.moved_at.values()])


def new_history(launched_at: float) -> History:
    return History(launched_at=launched_at, base=Baseline(at=launched_at))


@dataclass(frozen=True)
class Verdict:
    status: Status
    cause: Cause | None = None  # when status == "incident" (or spec_regression)
    reason: str = ""
    stall_class: StallClass | None = None
    phase: Phase | None = None
    moved: tuple[str, ...] = ()  # channels that moved at this poll
    figures: tuple[tuple[str, float], ...] = ()  # the observations that led to it

    @property
    def is_incident(self) -> bool:
        return self.status == "incident"


def _progress_key(obs: Observation) -> tuple[str, int] | None:
    p = obs.logs.progress
    return (p.label, p.done) if p is not None else None


def _moved_channels(
    base: Baseline, obs: Observation, dt: float, s: WatchdogSettings
) -> tuple[list[str], float, Baseline]:
    tree = obs.tree
    moved: list[str] = []
    if obs.logs.progress_lines > base.lines_total:
        moved.append("log")
    key = _progress_key(obs)
    if (
        key is not None
        and key != base.progress_key
        and (base.progress_key is None or key[0] != base.progress_key[0] or key[1] > base.progress_key[1])
    ):
        moved.append("progress")
    if obs.logs.phase != base.phase:
        moved.append("phase")
    cpu_rate = max(0.0, tree.cpu_time_s - base.cpu_time_s) / dt if dt > 0 else 0.0
    if cpu_rate >= s.cpu_progress_cores:
        moved.append("cpu")
    io = tree.read_chars + tree.write_chars
    if dt > 0 and (io - base.io_chars) / dt >= s.read_progress_bytes_per_s:
        moved.append("io")
    rss_ref = base.rss_ref
    if abs(tree.rss_bytes - rss_ref) >= s.rss_progress_bytes:
        moved.append("rss")
        rss_ref = tree.rss_bytes
    gpu_ref = base.gpu_mem_ref
    gpu_mem = obs.gpu.tree_mem_bytes
    if obs.gpu.status == "ok" and abs(gpu_mem - gpu_ref) >= s.gpu_mem_progress_bytes:
        moved.append("gpu_mem")
        gpu_ref = gpu_mem
    ports = frozenset(sock.port for sock in obs.ports.listening)
    if ports - base.ports:
        moved.append("port")
    nxt = Baseline(
        at=obs.at,
        lines_total=obs.logs.progress_lines,
        phase=obs.logs.phase,
        progress_key=key if key is not None else base.progress_key,
        cpu_time_s=tree.cpu_time_s,
        io_chars=io,
        rss_ref=rss_ref,
        gpu_mem_ref=gpu_ref,
        ports=ports | base.ports,
    )
    return moved, cpu_rate, nxt


def stall_class(cpu_rate: float, obs: Observation, s: WatchdogSettings, *, starved: bool = False) -> StallClass:
    """`starved` first: a tree that waited for a CPU most of its quiet time shows little CPU (it
    did not get any), and neither "busy" nor "idle" (deadlocked) says what happened to it."""
    if starved:
        return "starved"
    busy_gpu = obs.gpu.status == "ok" and obs.gpu.max_util_percent >= s.busy_gpu_percent
    return "busy" if cpu_rate >= s.busy_cpu_cores or busy_gpu else "idle"


def _exited(obs: Observation) -> Verdict | None:
    if obs.tree.root_alive:
        return None
    code = obs.tree.root_exit
    how = "exited" if code is None or code >= 0 else "killed by signal"
    val = "?" if code is None else str(code if code >= 0 else -code)
    # SGLang kills its own tree with SIGKILL when a rank fails (kill_process_tree): "killed by
    # signal 9" alone would send the operator to dmesg for an OOM killer that never ran.
    err = crash_error(obs.logs.errors)
    return Verdict(
        status="incident",
        cause="exited",
        reason=f"server main process {how} {val}" + (f"; the log's last error: {err}" if err else ""),
        phase=obs.logs.phase,
        figures=(("exit_code", float(code if code is not None else 0)),),
    )


def _ready_now(obs: Observation, h: History) -> bool:
    """Ready is proven, never printed: the server port is bound by a process of this tree and a
    health request to it answered. The ready line is a phase hint only: a child can print it without
    binding (a forged or broken server), and an orphan of an earlier launch can print it into the
    shared server.log. SGLang binds before its warm-up and prints the line after, so this is at most
    a health interval later than the line."""
    owned = obs.ports.server_port_owned
    if owned is None:  # the tree's descriptors are unreadable: the port accepting is all there is
        owned = obs.ports.server_port_accepts
    return owned and obs.health is not None and obs.health.ok


def assess_starting(h: History, obs: Observation, now: float, s: WatchdogSettings) -> tuple[Verdict, History]:
    gone = _exited(obs)
    if gone is not None:
        return gone, h
    gap = unwatched(obs.at - h.base.at, s)
    dt = obs.at - h.base.at - gap  # rates over the time watched: a jump's gap would zero them
    moved, cpu_rate, base = _moved_channels(h.base, obs, dt, s)
    moved_at = dict(h.moved_at)
    line_at = obs.logs.last_line_at
    for ch in moved:
        # Channels read from the log moved when the line was read, which can be up to a poll
        # before this observation; resource channels are only known at the poll.
        from_log = ch in LOG_CHANNELS and line_at is not None and line_at <= now
        moved_at[ch] = line_at if from_log and line_at is not None else now
    strong = any(c in STRONG_CHANNELS for c in moved)
    busy = fold_busy(h.busy, obs, now, strong, s)
    starved = _starved_step(h.starved, obs, s, spinning=spins(busy, obs, s), gap=gap)
    if strong:  # starved time counts from the last progress
        starved = starved.reset()
    h = replace(
        h, base=base, moved_at=moved_at, cpu_rate=cpu_rate, busy=busy, starved=starved, unwatched_s=h.unwatched_s + gap
    )
    phase = obs.logs.phase
    quiet = now - h.last_progress_at
    # Starvation extends the windows up to a ceiling; time the daemon did not watch is never counted.
    ext = extension(starved, s.startup_stall_s) + starved.unwatched_s
    # The tree spent most of its quiet time waiting for a CPU (a late daemon says nothing of the tree).
    is_starved = quiet > 0 and starved.waited_s >= 0.5 * quiet
    figures = (
        ("since_progress_s", quiet),
        ("since_launch_s", now - h.launched_at),
        ("tree_cpu_cores", round(cpu_rate, 3)),
        ("tree_rss_bytes", float(obs.tree.rss_bytes)),
        ("tree_gpu_mem_bytes", float(obs.gpu.tree_mem_bytes)),
        ("gpu_util_percent", obs.gpu.max_util_percent),
        ("log_lines", float(obs.logs.lines_total)),
        *busy_figures(h.busy, obs, now),
        *_sched_figures(starved, obs, ext),
    )
    if _ready_now(obs, h):
        h = replace(h, ready_at=now, starved=h.starved.reset())
        why = "port bound by the tree and health answered"
        return Verdict(status="ready", reason=why, phase="serving", moved=tuple(moved)), h
    if h.watched_since_launch(now) >= s.startup_timeout_s:
        return (
            Verdict(
                status="incident",
                cause="startup_timeout",
                reason=f"not ready after {s.startup_timeout_s:.0f} s (backstop), still in {phase}",
                stall_class=stall_class(cpu_rate, obs, s, starved=is_starved),
                phase=phase,
                moved=tuple(moved),
                figures=figures,
            ),
            h,
        )
    cpu_quiet = now - moved_at.get("cpu", h.launched_at)
    waiting = gpu_bound(h.busy, now, s)
    # The windows are judged on quiet time the tree could use: time it sat runnable without a CPU,
    # or that the daemon's own poll was late, does not count (up to the ceiling).
    counted = quiet - ext
    stalled = counted >= s.startup_stall_s and (
        cpu_quiet - ext >= s.startup_stall_s or counted >= s.cpu_only_stall_s or waiting
    )
    extended = extended_why(starved, s.startup_stall_s)
    if stalled:
        cls = stall_class(cpu_rate, obs, s, starved=is_starved)
        what = "only CPU moved" if cpu_quiet - ext < s.startup_stall_s else "no channel moved"
        if waiting and cpu_quiet - ext < s.startup_stall_s:
            cls, what = "busy", f"only CPU moved, and it waits on the GPU ({waiting})"
        return (
            Verdict(
                status="incident",
                cause="startup_stall",
                reason=f"{what} for {quiet:.0f} s in phase {phase} ({cls})" + (f"; {extended}" if extended else ""),
                stall_class=cls,
                phase=phase,
                moved=tuple(moved),
                figures=figures,
            ),
            h,
        )
    # Say so while starvation holds a verdict back (quiet past the window, judged on what is left).
    why = f"{phase}; {extended}" if extended and quiet >= s.startup_stall_s else f"{phase}"
    return Verdict(status="starting", reason=why, phase=phase, moved=tuple(moved), figures=figures), h


def _sched_figures(st: Starved, obs: Observation, ext: float) -> tuple[tuple[str, float], ...]:
    sched = obs.sched
    figs: list[tuple[str, float]] = [
        ("starved_wait_s", round(st.waited_s, 3)),
        ("daemon_late_s", round(st.late_s, 3)),
        ("window_extended_s", round(ext, 3)),
    ]
    if st.spun_s > 0:
        figs.append(("spin_wait_s", round(st.spun_s, 3)))  # run-queue wait of a spinning tree: not credited
    if st.unwatched_s > 0:
        figs.append(("unwatched_s", round(st.unwatched_s, 3)))  # poll gaps the daemon did not watch
    if sched.available:
        figs.append(("tree_run_wait_s", round(sched.run_wait_s, 3)))
    if sched.psi_some_avg10 is not None:
        figs.append(("host_cpu_pressure_some_avg10", sched.psi_some_avg10))
    return tuple(figs)


def _token_count(obs: Observation) -> float | None:
    sv = obs.serving
    if sv is None or not sv.available:
        return None
    if sv.decode_tokens_total is not None:
        return sv.decode_tokens_total
    return sv.generation_tokens_total


def _accept_sample(obs: Observation, h: History) -> tuple[float | None, float | None]:
    """A fresh acceptance-length reading taken while requests run, and the decode line's time."""
    sv = obs.serving
    # An accept length is at least 1.0 (the verified token); SGLang publishes 0.0 until its first
    # decode-log interval, so anything under 1.0 is "no reading yet", not a regression.
    if sv is not None and sv.available and sv.spec_accept_length is not None:
        running = (sv.running_reqs or 0) > 0
        return (sv.spec_accept_length if running and sv.spec_accept_length >= 1.0 else None), h.decode_at
    d = obs.logs.last_decode
    if d is None or d.accept_len is None or (h.decode_at is not None and d.at <= h.decode_at):
        return None, h.decode_at
    return (d.accept_len if d.running_reqs > 0 and d.accept_len >= 1.0 else None), d.at


def assess_serving(
    h: History, obs: Observation, now: float, s: WatchdogSettings, *, speculative: bool
) -> tuple[Verdict, History]:
    gone = _exited(obs)
    if gone is not None:
        return gone, h
    # Ranks: every scheduler/detokenizer seen while serving must stay alive.
    alive = {p.pid for p in obs.tree.processes if p.role in ("scheduler", "detokenizer") and p.status != "zombie"}
    lost = h.ranks - alive
    h = replace(h, ranks=h.ranks | alive)
    if lost:
        return (
            Verdict(
                status="incident",
                cause="rank_died",
                reason=f"child process(es) {sorted(lost)} of the server exited while the main process lives",
                phase="serving",
                figures=tuple(("lost_pid", float(p)) for p in sorted(lost)),
            ),
            replace(h, ranks=h.ranks - lost),
        )
    # Health.
    if obs.health is not None:
        fails = 0 if obs.health.ok else h.health_failures + 1
        # The first failed check began `latency_s` before its answer: the server failed since then.
        first = obs.health.at - max(0.0, obs.health.latency_s)
        since = None if obs.health.ok else (h.health_failing_since if h.health_failures else first)
        h = replace(h, health_failures=fails, health_failing_since=since, health_seen=h.health_seen + 1)
    h = replace(h, stopped_since=stopped_members(h.stopped_since, obs, now))
    held = stopped_verdict(h, obs, now)
    if held is not None:
        return held, h
    if h.health_failures >= s.health_failures:
        err = obs.health.error if obs.health is not None else ""
        return (
            Verdict(
                status="incident",
                cause="unhealthy",
                reason=f"{h.health_failures} health checks failed in a row ({err})",
                phase="serving",
                # How long it has failed: the outage's detection counts from the first failed check.
                figures=(
                    ("health_failures", float(h.health_failures)),
                    ("since_first_failure_s", round(max(0.0, now - (h.health_failing_since or now)), 3)),
                ),
            ),
            h,
        )
    # Token progress while requests are in flight.
    tokens = _token_count(obs)
    sv = obs.serving
    # In flight: the scheduler's gauges, or the HTTP front's open generation requests (the gauges can
    # freeze at 0 running when the stall follows a prefill line).
    busy = (
        sv is not None
        and sv.available
        and ((sv.running_reqs or 0) + (sv.queue_reqs or 0) > 0 or (sv.active_requests or 0) > 0)
    )
    starved = _starved_step(h.starved, obs, s, spinning=spins(None, obs, s))
    tokens_moved = tokens is not None and (h.tokens is None or tokens > h.tokens)
    # Finished requests are progress too (issue 51: one-token requests move no decode token); the
    # admissions are kept for the verdict's words (policy/admission.py).
    adm = admissions(sv)
    adm_moved = adm is not None and admissions_moved(h.admitted, adm)
    if adm is not None:
        h = replace(h, admitted=adm)
    if tokens_moved or adm_moved:
        # the scrape's own time: its answer may be attached a poll after it was taken
        scraped = sv.at if sv is not None and sv.at <= now else now
        h = replace(h, tokens=tokens if tokens_moved else h.tokens, tokens_moved_at=scraped)
        starved = starved.reset()
    if not busy:
        starved = starved.reset()
    h = replace(h, starved=starved)
    ext = extension(starved, s.serving_stall_s) + starved.unwatched_s
    if not busy:
        # Idle (or no metrics): an idle server's frozen gauges are not a stall.
        h = replace(h, tokens_moved_at=now if tokens is not None else h.tokens_moved_at)
    elif h.tokens_moved_at is not None and now - h.tokens_moved_at - ext >= s.serving_stall_s:
        assert sv is not None
        extended = extended_why(starved, s.serving_stall_s)
        return (
            Verdict(
                status="incident",
                cause="serving_stall",
                reason=(
                    f"{(sv.running_reqs or 0):.0f} running and {(sv.queue_reqs or 0):.0f} queued requests"
                    + (f" ({sv.active_requests:.0f} open at the HTTP front)" if sv.active_requests else "")
                    + ", "
                    f"no decode tokens for {now - h.tokens_moved_at:.0f} s"
                    + never_started(sv, h.admitted)
                    + (f"; {extended}" if extended else "")
                ),
                phase="serving",
                figures=(
                    ("running_reqs", float(sv.running_reqs or 0)),
                    ("queue_reqs", float(sv.queue_reqs or 0)),
                    ("tokens", float(tokens or 0)),
                    ("since_tokens_s", round(now - h.tokens_moved_at, 3)),
                    *admission_figures(h.admitted),
                    *_sched_figures(starved, obs, ext),
                ),
            ),
            h,
        )
    elif h.tokens_moved_at is None:
        h = replace(h, tokens_moved_at=now)
    # Speculative acceptance, judged only while traffic flows.
    if speculative:
        sample, decode_at = _accept_sample(obs, h)
        kept = tuple(x for x in h.accept_samples if x[0] > now - s.spec_window_s)
        if sample is not None:
            kept += ((now, sample),)
        h = replace(h, accept_samples=kept, decode_at=decode_at)
        samples = h.accept_samples
        span = samples[-1][0] - samples[0][0] if samples else 0.0
        if len(samples) >= 3 and span >= s.spec_window_s / 2:
            mean = sum(v for _, v in samples) / len(samples)
            if mean < s.spec_accept_floor:
                return (
                    Verdict(
                        status="degraded",
                        cause="spec_regression",
                        reason=f"speculative acceptance length {mean:.2f} under floor {s.spec_accept_floor:.2f}",
                        phase="serving",
                        figures=(("spec_accept_length", round(mean, 3)),),
                    ),
                    h,
                )
    if h.health_failures > 0:
        return (
            Verdict(
                status="degraded",
                reason=f"{h.health_failures} health check(s) failed in a row",
                phase="serving",
            ),
            h,
        )
    return Verdict(status="ready", reason="healthy", phase="serving"), h


def stopped_verdict(h: History, obs: Observation, now: float) -> Verdict | None:
    """A process of the tree stopped for more than a poll while health fails (policy/stopped.py)."""
    found = held_stopped(h.stopped_since, h.health_failures, obs, now)
    if found is None:
        return None
    return Verdict(status="incident", cause="unhealthy", reason=found.reason, phase="serving", figures=found.figures)


def assess(
    h: History, obs: Observation, now: float, s: WatchdogSettings, *, mode: Mode, speculative: bool = False
) -> tuple[Verdict, History]:
    """The watchdog's one decision per poll; pure."""
    fire = fired(obs)
    if fire is not None:  # SGLang judged the hang itself (supervisor/policy/sglangwd.py)
        cls, frame = dump_class(fire)
        why = reason(fire, obs.tree.root_alive) + (f"; its dump shows {frame}" if frame else "")
        phase = obs.logs.phase if mode == "starting" else "serving"
        fig = (("sglang_watchdog_timeout_s", fire.timeout_s or 0.0),)
        return Verdict("incident", cause_for(mode), why, stall_class=cls, phase=phase, figures=fig), h
    if mode == "starting":
        return assess_starting(h, obs, now, s)
    return assess_serving(h, obs, now, s, speculative=speculative)


def mean_accept(h: History) -> float | None:
    if not h.accept_samples:
        return None
    return sum(v for _, v in h.accept_samples) / len(h.accept_samples)


def ras_incident(v: RasVerdict, mode: Mode, phase: Phase | None) -> Verdict:
    """The RAS detector's finding as the watchdog's verdict: a lost rank is `rank_died`; frozen
    differing counts are the stall of the mode the server is in."""
    stall: Cause = "serving_stall" if mode == "serving" else "startup_stall"
    cause: Cause = "rank_died" if v.cause == "rank_died" else stall
    figures = tuple(("ras_rank", float(r)) for r in v.lagging)
    return Verdict("incident", cause, v.reason, phase="serving" if mode == "serving" else phase, figures=figures)
