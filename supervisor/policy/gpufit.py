"""Does the next launch fit beside the GPU memory that processes outside the server hold? (pure)

A stranger on the server's GPUs (a notebook, a profiler, a monitoring agent's CUDA context, a
neighbour's small server) is common on real hosts, and SGLang starts fine beside it when what it
takes is free: it sizes its static pool (weights and KV cache) as `--mem-fraction-static` of the
GPU's *total* memory and fails at start ("Not enough memory") when that is not there. So a launch
is judged by need, not by presence:

- need on a GPU: `--mem-fraction-static` x that GPU's total, or the `[slate] gpu_need_gib` floor
  when that is larger; without either the need is unknown (SGLang picks its own fraction), and an
  unknown need is never a reason to refuse: the daemon does not refuse on a guess.
- free on a GPU: total - what others use, where "others" is the GPU's used memory less what this
  daemon's own processes hold (being stopped), and never less than the strangers' bytes summed.
  A total the probe could not read (0) leaves free unknown: not a refusal either.
- fits: on every server GPU that a stranger is on, free >= need.

Policies (`[slate] gpu_strangers`): `launch` launches when it fits, else waits (the launch is
refused with the numbers and retried on the refused-launch backoff); `wait` waits while any
stranger holds memory on the server's GPUs, whatever it holds (the strict form of waiting);
`refuse` does not wait at all: any stranger means `failed` at once, a page, and the failed
cooldown (for hosts where a stranger on a serving GPU is itself the incident).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from supervisor.config.slate import StrangerPolicy
from supervisor.engines import SGLANG, EngineProfile

Policy = StrangerPolicy  # [slate] gpu_strangers

Action = Literal["launch", "wait", "refuse"]
GIB = 2**30
FRACTION_FLAG = "--mem-fraction-static"


@dataclass(frozen=True)
class Stranger:
    """A process outside the server (no marker of this daemon) holding memory on a server GPU."""

    pid: int
    gpu: int
    used_bytes: int
    command: str

    def named(self) -> str:
        return f"pid {self.pid} ({self.command}) {size(self.used_bytes)}"


def size(n: int) -> str:
    """GiB to one decimal; below 1 GiB in MiB, so a small holder does not read "0.0 GiB"."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True)
class GpuRoom:
    """One server GPU as the snapshot saw it. `total_bytes` 0: unknown."""

    index: int
    total_bytes: int
    used_bytes: int
    ours_bytes: int = 0  # held by this daemon's own processes, which are being stopped


@dataclass(frozen=True)
class Need:
    fraction: float | None  # the rung's --mem-fraction-static; None: not set (SGLang picks one)
    floor_bytes: int | None = None  # [slate] gpu_need_gib; None: not set
    flag: str = FRACTION_FLAG.removeprefix("--")  # the engine's name for the fraction (vLLM: gpu-memory-utilization)

    def bytes_on(self, total_bytes: int) -> int | None:
        by_fraction = int(self.fraction * total_bytes) if self.fraction is not None and total_bytes > 0 else None
        known = [b for b in (by_fraction, self.floor_bytes) if b is not None]
        return max(known) if known else None

    def describe(self) -> str:
        parts = []
        if self.fraction is not None:
            parts.append(f"{self.flag} {self.fraction:g}")
        if self.floor_bytes is not None:
            parts.append(f"[slate] gpu_need_gib {self.floor_bytes / GIB:g}")
        return ", ".join(parts) or "need unknown"


@dataclass(frozen=True)
class GpuFit:
    index: int
    total_bytes: int | None  # None: unknown
    free_bytes: int | None  # None: unknown
    need_bytes: int | None  # None: unknown
    strangers: tuple[Stranger, ...]

    @property
    def fits(self) -> bool | None:
        """None: cannot be told (unknown total or need); never read as "does not fit"."""
        if self.free_bytes is None or self.need_bytes is None:
            return None
        return self.free_bytes >= self.need_bytes

    def line(self, need: Need) -> str:
        free = "free unknown" if self.free_bytes is None else f"{self.free_bytes / GIB:.1f} GiB free"
        of = "" if self.total_bytes is None else f" of {self.total_bytes / GIB:.0f} GiB"
        wants = (
            "the rung's need is unknown"
            if self.need_bytes is None
            else f"the rung needs {self.need_bytes / GIB:.1f} GiB ({need.describe()})"
        )
        held = ", ".join(s.named() for s in self.strangers[:5])
        return f"GPU {self.index}: {free}{of}, {wants}; held by {held}"


@dataclass(frozen=True)
class FitDecision:
    action: Action
    why: str  # "" when nothing outside the server holds memory
    gpus: tuple[GpuFit, ...]  # the server GPUs that strangers are on
    strangers: tuple[Stranger, ...]


def mem_fraction(argv: Sequence[str], flag: str = FRACTION_FLAG) -> float | None:
    """The last `--mem-fraction-static X` (or `=X`; vLLM's `--gpu-memory-utilization`) in the rendered
    command line, as argparse reads it; a value outside (0, 1] or not a number is not a need (the
    engine refuses it)."""
    found: str | None = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    if found is None:
        return None
    try:
        value = float(found)
    except ValueError:
        return None
    return value if 0 < value <= 1 else None


def need_of(argv: Sequence[str], floor_gib: float | None, engine: EngineProfile = SGLANG) -> Need:
    """The need of the command line about to be launched, with `[slate] gpu_need_gib`; the engine
    names the fraction's flag and what it assumes unset (vLLM: 0.9)."""
    name = engine.flags.mem_fraction
    fraction = mem_fraction(argv, "--" + name)
    if fraction is None:
        fraction = engine.flags.mem_fraction_default
    return Need(fraction, None if floor_gib is None else int(floor_gib * GIB), name)


def fit(rooms: Iterable[GpuRoom], strangers: Sequence[Stranger], need: Need) -> tuple[GpuFit, ...]:
    """Per server GPU that a stranger is on; a stranger's GPU missing from `rooms` has unknown size."""
    by_index = {r.index: r for r in rooms}
    out = []
    for index in sorted({s.gpu for s in strangers}):
        on = tuple(s for s in strangers if s.gpu == index)
        room = by_index.get(index)
        if room is None or room.total_bytes <= 0:
            out.append(GpuFit(index, None, None, need.bytes_on(0), on))
            continue
        others = max(room.used_bytes - room.ours_bytes, sum(s.used_bytes for s in on))
        free = max(0, room.total_bytes - others)
        out.append(GpuFit(index, room.total_bytes, free, need.bytes_on(room.total_bytes), on))
    return tuple(out)


def decide(rooms: Iterable[GpuRoom], strangers: Sequence[Stranger], need: Need, policy: Policy) -> FitDecision:
    """launch / wait / refuse for the next launch, with the numbers in `why`."""
    if not strangers:
        return FitDecision("launch", "", (), ())
    gpus = fit(rooms, strangers, need)
    lines = "; ".join(g.line(need) for g in gpus)
    if policy in ("wait", "refuse"):
        strict = f'[slate] gpu_strangers = "{policy}": no launch while a process outside the server holds GPU memory'
        return FitDecision(policy, f"{strict}: {lines}", gpus, tuple(strangers))
    short = [g for g in gpus if g.fits is False]
    if short:
        return FitDecision(
            "wait", f"the launch does not fit: {'; '.join(g.line(need) for g in short)}", gpus, tuple(strangers)
        )
    unknown = [g for g in gpus if g.fits is None]
    head = "fits beside processes outside the server" if not unknown else "launching: cannot tell whether it fits"
    return FitDecision("launch", f"{head}: {lines}", gpus, tuple(strangers))


def refusals_to_cap(backoff_initial_s: float, backoff_max_s: float) -> int:
    """How many refusals in a row bring the refused-launch backoff (initial x 2^(n-1)) to its cap:
    that refusal is told (`launch_blocked`, a notification) once, naming the holders, so a launch
    that waits on a stranger never loops unannounced. 7 with the defaults (5 s to 300 s), after
    about 5 minutes of waiting; 1 when there is no growth to wait out."""
    if backoff_initial_s <= 0 or backoff_max_s <= backoff_initial_s:
        return 1
    n = 1
    while backoff_initial_s * 2 ** (n - 1) < backoff_max_s:
        n += 1
    return n
