"""Is CPU that moves while a server starts progress? Pure rules over py-spy looks and GPM readings.

- A thread waits on the GPU when its innermost Python frame is a CUDA wait (`synchronize` in
  torch/cuda/streams.py or torch/cuda/__init__.py, a c10d barrier or collective in
  torch/distributed) or its source line calls `.item()`, `.tolist()`, `.cpu()` or `.synchronize()`:
  those spin in the driver until the GPU is done, at one core.
- A thread compiles when any of its frames is in a compiler or autotuner (inductor, dynamo, triton,
  deep_gemm's JIT, torch's cpp_extension/nvcc, flashinfer's JIT, tvm-ffi): real progress, even when
  the autotuner synchronizes to time a kernel.
- A GPU spins when NVML says it is busy (a kernel resident) while GPM says almost no SM works.
- Without GPM, a GPU spins when NVML says it is busy while it draws near its idle power
  (policy/gpupower.py, issue 35).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from probes.types import BusySample, BusyThread, GpmObservation, GpuObservation, Observation
from supervisor.config.settings import WatchdogSettings
from supervisor.policy.gpupower import learn_idle, power_text, readings, spinning_by_power

ThreadKind = Literal["gpu_wait", "compile", "working", "idle"]
SampleKind = Literal["gpu_wait", "compile", "working", "none", "error"]
NEUTRAL = frozenset({"none", "error"})

_COMPILE_FILE = re.compile(
    r"torch/_inductor/|torch/_dynamo/|torch/utils/cpp_extension\.py|(?:^|/)triton/|deep_gemm|"
    r"flashinfer/jit/|tvm_ffi/|torch/_functorch/aot_autograd|(?:^|/)nvcc|cuda/bindings/nvrtc"
)
_COMPILE_FUNC = re.compile(r"^(?:autotune\w*|benchmark_all_configs|compile_fx\w*|do_bench\w*|_compile)$")
_WAIT_FUNC = {
    "torch/cuda/streams.py": frozenset({"synchronize", "wait", "wait_event", "wait_stream", "elapsed_time"}),
    "torch/cuda/__init__.py": frozenset({"synchronize"}),
    "torch/cuda/graphs.py": frozenset({"replay"}),
}
_WAIT_DIST = re.compile(r"torch/distributed/(?:distributed_c10d|c10d_logger)\.py$")
# py-spy's --nonblocking "active" is a heuristic: a thread that just woke in a Python-level wait can
# show active. Those sleep in the kernel and burn nothing: they say nothing about the busy core.
_IDLE_FILE = re.compile(r"(?:^|/)(?:threading|selectors|queue|socket|subprocess|multiprocessing/connection)\.py$")
_IDLE_FUNC = re.compile(r"^(?:wait|acquire|select|poll|get|recv\w*|accept|join|_wait_for_tstate_lock|_poll|read)$")
_WAIT_CODE = re.compile(r"\.(?:item|tolist|cpu|synchronize)\(\s*\)|torch\.cuda\.synchronize\(|\.wait\(\s*\)\s*$")


def _wait_frame(thread: BusyThread) -> bool:
    if not thread.frames:
        return False
    top = thread.frames[0]
    path = top.file.replace("\\", "/")
    for suffix, funcs in _WAIT_FUNC.items():
        if path.endswith(suffix) and top.function.rsplit(".", 1)[-1] in funcs:
            return True
    if _WAIT_DIST.search(path):
        return True
    return bool(_WAIT_CODE.search(top.code))


def _idle(thread: BusyThread) -> bool:
    top = thread.frames[0] if thread.frames else None
    return top is not None and bool(
        _IDLE_FILE.search(top.file.replace("\\", "/")) and _IDLE_FUNC.match(top.function.rsplit(".", 1)[-1])
    )


def thread_kind(thread: BusyThread) -> ThreadKind:
    for f in thread.frames:
        if _COMPILE_FILE.search(f.file.replace("\\", "/")) or _COMPILE_FUNC.match(f.function.rsplit(".", 1)[-1]):
            return "compile"
    if _wait_frame(thread):
        return "gpu_wait"
    return "idle" if _idle(thread) else "working"


def sample_kind(sample: BusySample) -> SampleKind:
    """What the busy threads of one look were doing; `none` when py-spy saw no active thread."""
    kinds = [k for k in (thread_kind(t) for t in sample.threads) if k != "idle"]
    if not kinds:
        return "error" if sample.error else "none"
    if "compile" in kinds:
        return "compile"
    if all(k == "gpu_wait" for k in kinds):
        return "gpu_wait"
    return "working"


def where(thread: BusyThread) -> str:
    """`pid 12 'MainThread' in synchronize (torch/cuda/streams.py:225)`: the frame that waits."""
    if not thread.frames:
        return f"pid {thread.pid} '{thread.name}'"
    f = thread.frames[0]
    short = "/".join(f.file.replace("\\", "/").split("/")[-3:])
    at = f"{short}:{f.line}" if f.line is not None else short
    return f"pid {thread.pid} '{thread.name}' in {f.function} ({at})"


def tree_devices(gpu: GpuObservation) -> frozenset[int]:
    """The GPUs the tree holds memory on; every GPU when NVML attributes none (a container)."""
    held = frozenset(p.gpu_index for p in gpu.processes)
    return held or frozenset(d.index for d in gpu.devices)


def gpu_spinning(gpu: GpuObservation, gpm: GpmObservation, busy_percent: float, sm_floor: float) -> bool:
    """A GPU of the tree is busy by NVML and no GPU of the tree does real SM work by GPM."""
    if gpu.status != "ok" or gpm.status != "ok" or not gpm.devices:
        return False
    mine = tree_devices(gpu)
    util = {d.index: d.util_percent for d in gpu.devices if d.index in mine}
    sm = {d.index: d.sm_active_ratio for d in gpm.devices if d.index in mine}
    busy = [i for i, u in util.items() if u >= busy_percent and i in sm]
    return bool(busy) and max(sm.values(), default=0.0) <= sm_floor


def max_sm_active(gpm: GpmObservation, indices: Iterable[int] | None = None) -> float | None:
    keep = None if indices is None else frozenset(indices)
    vals = [d.sm_active_ratio for d in gpm.devices if keep is None or d.index in keep]
    return max(vals) if vals else None


@dataclass(frozen=True)
class BusyState:
    """What the watchdog keeps of the GPM readings and py-spy looks while a server starts."""

    spin_since: float | None = None  # since when GPM has shown the tree's GPU spinning (None: not now)
    kinds: tuple[SampleKind, ...] = ()  # py-spy looks since strong progress last moved, oldest first
    waits_in: str = ""  # the frame a busy thread waited in at the last look ("" if none did)
    looked_at: float | None = None  # when the last look was taken
    sm_active: float | None = None  # the tree's highest GPM SM activity at the last poll (None: no GPM)
    idle_power: tuple[tuple[int, float], ...] = ()  # per GPU index the lowest draw seen at util 0 (W)
    power_since: float | None = None  # since when the power rule has shown the tree's GPU spinning
    power_said: str = ""  # the power rule's reading at the last poll that showed a spin


def fold_busy(b: BusyState, obs: Observation, now: float, strong_moved: bool, s: WatchdogSettings) -> BusyState:
    """This poll's GPM reading and py-spy look folded in; strong progress starts a new window."""
    spin = gpu_spinning(obs.gpu, obs.gpm, s.busy_gpu_percent, s.gpm_spin_sm_active)
    spin_since = (b.spin_since if b.spin_since is not None else now) if spin else None
    kinds, waits_in, looked = b.kinds, b.waits_in, b.looked_at
    if strong_moved:
        kinds, waits_in = (), ""
    elif obs.busy is not None:
        kinds = (*kinds, sample_kind(obs.busy))[-20:]
        waits = [t for t in obs.busy.threads if thread_kind(t) == "gpu_wait"]
        waits_in = where(waits[0]) if waits else ""
        looked = obs.busy.at
    sm = max_sm_active(obs.gpm, tree_devices(obs.gpu)) if obs.gpu.status == "ok" else None
    idle = learn_idle(b.idle_power, obs.gpu)
    power = None
    if obs.gpm.status != "ok" and obs.gpu.status == "ok":  # GPM, where there is one, is the better signal
        rs = readings(obs.gpu, idle, s.gpu_idle_power_w, tree_devices(obs.gpu))
        power = spinning_by_power(rs, s.busy_gpu_percent, s.power_spin_fraction)
    power_since = (b.power_since if b.power_since is not None else now) if power is not None else None
    return BusyState(
        spin_since=spin_since,
        kinds=kinds,
        waits_in=waits_in,
        looked_at=looked,
        sm_active=sm,
        idle_power=idle,
        power_since=power_since,
        power_said=power_text(power) if power is not None else "",
    )


def gpu_bound(b: BusyState, now: float, s: WatchdogSettings) -> str:
    """Why the CPU that moves only waits on the GPU ("" when it may be working): GPM saw the GPU
    spin for the whole stall window, or the last `gpu_wait_samples` py-spy looks all found the busy
    threads in a GPU wait. A look that found a compiler wins over GPM (an autotuner times kernels)."""
    last = b.kinds[-1] if b.kinds else None
    if b.spin_since is not None and now - b.spin_since >= s.startup_stall_s and last != "compile":
        sm = f"{b.sm_active:.2%}" if b.sm_active is not None else "?"
        return f"GPM: GPU busy, SM activity {sm} (floor {s.gpm_spin_sm_active:.0%}) for {now - b.spin_since:.0f} s"
    if b.power_since is not None and now - b.power_since >= s.startup_stall_s and last != "compile":
        return f"{b.power_said} for {now - b.power_since:.0f} s"
    need = s.gpu_wait_samples
    # A look that found no busy thread (the spinner was descheduled on a loaded host) or failed says
    # nothing either way: it neither breaks nor extends the run of GPU waits.
    recent = [k for k in b.kinds if k not in NEUTRAL][-need:]
    if len(recent) >= need and all(k == "gpu_wait" for k in recent):
        return f"py-spy: {need} looks in a row found the busy threads in a GPU wait, {b.waits_in}"
    return ""


def busy_figures(b: BusyState, obs: Observation, now: float) -> tuple[tuple[str, float], ...]:
    out: list[tuple[str, float]] = []
    sm = max_sm_active(obs.gpm, tree_devices(obs.gpu)) if obs.gpu.status == "ok" else None
    if sm is not None:
        out.append(("gpm_sm_active_ratio", sm))
    if b.spin_since is not None:
        out.append(("gpm_spin_s", round(now - b.spin_since, 3)))
    if b.power_since is not None:
        out.append(("power_spin_s", round(now - b.power_since, 3)))
    if b.kinds:
        out.append(("gpu_wait_looks", float(sum(k == "gpu_wait" for k in b.kinds))))
        out.append(("busy_looks", float(len(b.kinds))))
    return tuple(out)


def wants_look(quiet_s: float, cpu_quiet_s: float, s: WatchdogSettings) -> bool:
    """Look while CPU has been the only channel moving for half the stall window: by the time the
    window ends, `gpu_wait_samples` looks can agree (at one look per poll)."""
    return quiet_s >= s.startup_stall_s / 2 and cpu_quiet_s < s.startup_stall_s
