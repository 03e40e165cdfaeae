"""Turning an incident into a diagnostics capture request, and the bundle's class into the incident's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from probes.types import BusySample, GpuObservation, Observation
from supervisor.config.render import RenderedCommand
from supervisor.config.settings import Settings
from supervisor.daemon.observe import Observer
from supervisor.diagnostics import BundleResult, CaptureRequest, capture, new_incident_id, self_check
from supervisor.diagnostics.frtrace import FrTraceJob, trace_into_bundle
from supervisor.diagnostics.selfcheck import busy_signal_check
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.policy.gpuwait import sample_kind, thread_kind, where
from supervisor.policy.watchdog import StallClass, Verdict
from supervisor.process import resume_stopped
from supervisor.status.causes import HangClass
from supervisor.status.commands import CommandResult
from supervisor.status.snapshot import ToolCheck

Record = Callable[..., None]  # the owner's `record(event, level, /, *, only=None, **fields)`
Beating = Callable[[Awaitable[Any]], Awaitable[Any]]


def provisional_class(verdict: Verdict | None) -> HangClass | None:
    """The watchdog's own guess, used when no bundle could classify the hang."""
    if verdict is None or verdict.cause in ("exited", "manual", "spec_regression"):
        return None
    if verdict.phase == "capturing_graphs":
        return "cuda_graph_capture"
    cls: StallClass | None = verdict.stall_class
    if cls == "busy":
        return "busy_spin"
    if cls == "idle":
        return "idle_deadlock"
    return "unknown"


MAX_CULPRIT_CHARS = 600


def kept_bundle(diag_dir: Path, bundle_id: str) -> dict[str, object] | None:
    """The summary of the bundle already written under `bundle_id` ({} when unreadable); None: none.
    A group incident has one bundle per node: asked again for it (a successor leader), a member
    answers with the one it wrote, whatever became of the request that asked first."""
    path = diag_dir / bundle_id
    if not path.is_dir():
        return None
    try:
        doc = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def culprit_text(summary: Mapping[str, object]) -> str | None:
    """The bundle's culprit line (summary.json `culprit.text`) for /status, the page and notifications."""
    doc = summary.get("culprit")
    text = doc.get("text") if isinstance(doc, Mapping) else None
    # A bound for what a bundle on disk can put in /status and notifications; a real line (thread,
    # innermost frame, the server's frame that called it) runs to about 330 characters.
    return str(text)[:MAX_CULPRIT_CHARS] if text else None


def busy_look_doc(look: BusySample | None) -> dict[str, object] | None:
    """The py-spy look taken at the judging poll (issue 22): which busy thread did what."""
    if look is None:
        return None
    return {
        "pids": list(look.pids),
        "error": look.error,
        "kind": sample_kind(look),
        "threads": [{"at": where(t), "kind": thread_kind(t)} for t in look.threads[:16]],
    }


def verdict_doc(verdict: Verdict | None, obs: Observation | None) -> dict[str, object]:
    doc: dict[str, object] = {}
    if verdict is not None:
        doc.update(
            status=verdict.status,
            cause=verdict.cause,
            reason=verdict.reason,
            stall_class=verdict.stall_class,
            phase=verdict.phase,
            moved=list(verdict.moved),
            figures=dict(verdict.figures),
        )
    if obs is not None:
        doc["observation"] = {
            "tree_cpu_time_s": obs.tree.cpu_time_s,
            "tree_rss_bytes": obs.tree.rss_bytes,
            "tree_read_chars": obs.tree.read_chars,
            "processes": len(obs.tree.processes),
            "listening_ports": sorted({s.port for s in obs.ports.listening}),
            "server_port_accepts": obs.ports.server_port_accepts,
            "log_lines": obs.logs.lines_total,
            "phase": obs.logs.phase,
            "errors": list(obs.logs.errors[-5:]),
            "gpu_status": obs.gpu.status,
            "gpu_tree_mem_bytes": obs.gpu.tree_mem_bytes,
            "gpu_max_util_percent": obs.gpu.max_util_percent,
            "gpm_status": obs.gpm.status,
            "gpm_reason": obs.gpm.reason,
            "gpm_sm_active_ratio": {str(d.index): d.sm_active_ratio for d in obs.gpm.devices},
            "busy_look": busy_look_doc(obs.busy),
        }
    return doc


async def collect(
    *,
    settings: Settings,
    incident_id: str,
    trigger: str,
    cause: str | None,
    obs: Observation,
    verdict: Verdict | None,
    rendered: RenderedCommand,
    env: Mapping[str, str],
    log_tail: list[str],
    gpu_all: GpuObservation | None,
    cpu_rate: float | None,
    native: bool | None = None,
    gdb: bool | None = None,
    hung: bool,
    created_at: float | None = None,
    gpu_xids: tuple[Mapping[str, object], ...] = (),
    group: Mapping[str, object] | None = None,
) -> BundleResult:
    d = settings.diagnostics
    use_gdb = gdb if gdb is not None else (d.gdb == "always" or (d.gdb == "on_hang" and hung))
    req = CaptureRequest(
        incident_id=incident_id,
        trigger="hung" if trigger == "hung" else "manual",
        cause=cause,
        processes=obs.tree.processes,
        py_spy=d.py_spy,
        native=d.native if native is None else native,
        gdb=use_gdb,
        # A person who asks for gdb or native frames explicitly accepts a brief pause of each process
        # (py-spy --native must stop a process to unwind it); otherwise a healthy server is not paused.
        nonblocking=not hung and not gdb and native is not True,
        py_spy_timeout_s=d.py_spy_timeout_s,
        gdb_timeout_s=d.gdb_timeout_s,
        log_tail=tuple(log_tail[-d.log_tail_lines :]),
        rung=rendered.rung,
        argv=rendered.argv,
        env=dict(env),
        phase=obs.logs.phase,
        verdict=verdict_doc(verdict, obs),
        gpu=gpu_all,
        gpm=obs.gpm,
        sglang_watchdog=obs.sglang_watchdog.line if obs.sglang_watchdog is not None else "",
        sglang_dumps=obs.sglang_watchdog.dumps if obs.sglang_watchdog is not None else (),
        tree_cpu_cores=cpu_rate,
        gpu_util_percent=obs.gpu.max_util_percent if obs.gpu.status == "ok" else None,
        busy_cpu_cores=settings.watchdog.busy_cpu_cores,
        busy_gpu_percent=settings.watchdog.busy_gpu_percent,
        created_at=created_at,
        gpu_xids=gpu_xids,
        group=group,
        flight_recorder=d.flight_recorder,
        flight_recorder_wait_s=d.flight_recorder_wait_s,
    )
    return await capture(
        req,
        Path(settings.paths.state_dir) / "diagnostics",
        keep=d.keep,
        max_bytes=int(d.max_mb * 1024 * 1024),
        py_spy_path=d.py_spy_path,
        gdb_path=d.gdb_path,
        resume=resume_stopped,
    )


# Every incident gets an id of its own: the time-and-cause id, with `-2`, `-3`... when that second
# already has one (two restarts 0.28 s apart got the same id, and the second bundle overwrote the
# first). `taken`, the owner's memory of recent ids, is kept to the last `KEEP`.
KEEP = 100


def unique_incident_id(wall: float, cause: str, taken: list[str], diagnostics: Path) -> str:
    """A daemon restarted within the second has no memory of the ids: the bundle directories
    under `diagnostics` say which are taken."""
    base = new_incident_id(wall, cause)
    candidate, n = base, 1
    while candidate in taken or (diagnostics / candidate).exists():
        n += 1
        candidate = f"{base}-{n}"
    taken.append(candidate)
    del taken[:-KEEP]
    return candidate


class Bundles:
    """Each bundle taken, told once: counted (`diagnostics` metric, write errors), journalled, logged;
    torch's Flight Recorder analyzer then runs over a written bundle's dumps beside the relaunch."""

    def __init__(self, record: Record, metrics: SupervisorMetrics, beating: Beating) -> None:
        self.record, self.metrics, self.beating = record, metrics, beating
        self.write_errors = 0
        self.after: set[asyncio.Task[None]] = set()  # torch's FR analyzer over written bundles

    async def take(self, incident_id: str, trigger: str, capture: Awaitable[BundleResult]) -> BundleResult | None:
        try:
            result: BundleResult = await self.beating(capture)
        except Exception as err:  # a capture must never take the daemon down
            self.record("diagnostics_failed", "exception", only="log", id=incident_id)
            self.record("diagnostics_failed", only="journal", id=incident_id, error=repr(err))
            return None
        written = result.path is not None
        if not written:
            self.write_errors += 1
        self.metrics.diagnostic(result.duration_s, "written" if written else "write_failed")
        self.record(
            "bundle_written" if written else "bundle_write_failed",
            only="journal",
            id=result.id,
            hang_class=result.hang_class if trigger == "hung" else None,  # a healthy server is not "deadlocked"
            duration_s=round(result.duration_s, 3),
            error=result.error,
        )
        if result.fr_trace is not None:
            task = asyncio.get_running_loop().create_task(self.fr_trace(result.id, result.fr_trace))
            self.after.add(task)
            task.add_done_callback(self.after.discard)
        # A bundle that could not be written (full disk) is a warning: the incident goes on without it.
        level = "info" if written else "warning"
        fields = {"hang_class": result.hang_class, "path": str(result.path), "error": result.error}
        self.record("bundle", level, only="log", id=result.id, **fields)
        return result

    async def fr_trace(self, bundle_id: str, job: FrTraceJob) -> None:
        """torch's Flight Recorder analyzer over a written bundle's dumps, while the relaunch goes on."""
        try:
            done = await trace_into_bundle(job)
        except Exception as err:  # the analyzer must never cost the daemon anything
            self.record("fr_trace", "warning", id=bundle_id, outcome="error", detail=repr(err)[:300])
            return
        level = "info" if done.outcome == "written" else "warning"
        fields = {"outcome": done.outcome, "duration_s": done.duration_s, "detail": done.detail}
        self.record("fr_trace", level, id=bundle_id, **fields)

    async def close(self) -> None:
        for task in list(self.after):
            task.cancel()
        await asyncio.gather(*self.after, return_exceptions=True)


def answer_of(result: BundleResult | None, state: str) -> CommandResult:
    """A diagnose command's answer: the bundle's id and summary, or why there is none."""
    if result is None:
        return CommandResult("failed", "capture failed", state)
    bundle = result.id if result.path is not None else None
    return CommandResult("done", result.error or "captured", state, bundle_id=bundle, summary=dict(result.summary))


SELFCHECK_EVERY_S = 3600.0  # the self-check runs again hourly: what was fixed meanwhile clears


class SelfChecks:
    """The self-check (tools, ptrace, GPM, the busy signal), at start, after a reload and hourly
    (issue 38): a tool installed or a permission granted since clears without a daemon restart.
    Logged in full the first time, then only what changed."""

    def __init__(self, record: Record, monotonic: Callable[[], float]) -> None:
        self.record, self.monotonic = record, monotonic
        self.checks: tuple[ToolCheck, ...] = ()
        self.at = monotonic()  # of the last run (start-up runs the first)

    def due(self) -> bool:
        return self.monotonic() - self.at >= SELFCHECK_EVERY_S

    async def refresh(self, settings: Settings, observer: Observer) -> None:
        d = settings.diagnostics
        tools = await asyncio.to_thread(self_check, d.py_spy_path, d.gdb_path)
        gpm = await asyncio.to_thread(observer.gpm_check)
        gpus = await asyncio.to_thread(observer.gpu.snapshot_all)
        signal = busy_signal_check(gpus, gpm.ok, gpm.detail, settings.watchdog.gpu_idle_power_w)
        before = {c.name: c.ok for c in self.checks}
        self.checks = (*tools, gpm, signal, *observer.gpu_source_checks())
        self.at = self.monotonic()
        for check in self.checks:
            if before.get(check.name) != check.ok:
                self.record("selfcheck", only="log", tool=check.name, ok=check.ok, detail=check.detail)
