"""Observation builders shared by the unit tests of the watchdog and the supervisor."""

from __future__ import annotations

from probes.types import (
    DecodeStats,
    GpuDevice,
    GpuObservation,
    GpuProcess,
    HealthObservation,
    ListenSocket,
    LogObservation,
    Observation,
    PortsObservation,
    ProcInfo,
    Progress,
    ServingObservation,
    TreeObservation,
)

MB = 1024 * 1024


def proc(pid: int, role: str = "main", status: str = "sleeping") -> ProcInfo:
    return ProcInfo(
        pid=pid,
        ppid=1,
        title=role,
        status=status,
        role=role,  # type: ignore[arg-type]
        rank=None,
        cpu_time_s=0,
        rss_bytes=0,
        read_chars=0,
        write_chars=0,
        num_threads=1,
    )


def obs(
    at: float,
    *,
    lines: int = 10,
    phase: str = "loading_weights",
    progress: Progress | None = None,
    cpu: float = 1.0,
    io: int = 0,
    rss: int = 100 * MB,
    gpu_mem: int = 0,
    gpu_util: float = 0.0,
    ports: tuple[int, ...] = (),
    accepts: bool = False,
    owned: bool | None = False,
    ready: bool = False,
    alive: bool = True,
    exit_code: int | None = None,
    procs: tuple[ProcInfo, ...] = (),
    health: HealthObservation | None = None,
    serving: ServingObservation | None = None,
    decode: DecodeStats | None = None,
    line_at: float | None = None,
) -> Observation:
    tree = TreeObservation(
        root_pid=100,
        root_alive=alive,
        root_exit=exit_code,
        processes=procs or (proc(100),),
        cpu_time_s=cpu,
        rss_bytes=rss,
        read_chars=io,
        write_chars=0,
    )
    gpu = GpuObservation(
        status="ok",
        reason="",
        devices=(GpuDevice(0, "GPU-0", "H200", gpu_util, gpu_mem, 140 * 1024 * MB),),
        processes=(GpuProcess(100, 0, "GPU-0", gpu_mem),) if gpu_mem else (),
    )
    logs = LogObservation(
        lines_total=lines,
        last_line_at=line_at,
        phase=phase,
        progress=progress,  # type: ignore[arg-type]
        ready_line_seen=ready,
        last_decode=decode,
    )
    return Observation(
        at=at,
        tree=tree,
        ports=PortsObservation(tuple(ListenSocket(100, "127.0.0.1", p) for p in ports), accepts, owned),
        logs=logs,
        gpu=gpu,
        health=health,
        serving=serving,
    )
