"""Is a busy GPU working? Power draw against the GPU's idle and busy power, for GPUs without GPM
(issue 35): A100, L40S, MIG slices, where the busy rule otherwise has only py-spy looks.

NVML's utilisation says a kernel was resident; one kernel spinning on a flag reads 100 %. Such a
kernel keeps a few SMs clocked and the rest of the chip idle, so the board draws little more than
idle: SGLang users report EAGLE verification hangs at 100 % utilisation and about 25 W
(sglang#35822). Real work at 100 % utilisation draws a good share of the board's power limit.

The rule, pure: a GPU of the tree whose utilisation is at least `busy_gpu_percent` while its draw is
within `power_spin_fraction` of the way from its idle power to its enforced power limit is spinning.
Idle power is `[watchdog] gpu_idle_power_w` when set, else the lowest draw the daemon has seen on
that GPU while its utilisation read 0 (learned from the polls, before the server loads or between
launches). Without a power reading, a limit, or an idle reference, the rule says nothing (None).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from probes.types import GpuObservation

IDLE_UTIL_PERCENT = 0.0  # only a reading with no kernel resident teaches the idle power


@dataclass(frozen=True)
class PowerReading:
    index: int
    util_percent: float
    power_w: float
    idle_w: float
    limit_w: float

    @property
    def fraction(self) -> float:
        """How far from idle towards the limit the draw is (0: idle, 1: at the limit)."""
        span = self.limit_w - self.idle_w
        return max(0.0, (self.power_w - self.idle_w) / span) if span > 0 else 1.0


def power_spinning(
    util: float, power: float | None, idle: float | None, limit: float | None, busy_percent: float, spin_fraction: float
) -> bool | None:
    """True: busy by NVML but drawing near idle (a spin); False: busy and drawing (work) or not busy;
    None: not judgeable (no reading, no limit, no idle reference, or a limit not above idle)."""
    if power is None or idle is None or limit is None or limit <= idle:
        return None
    if util < busy_percent:
        return False
    return PowerReading(0, util, power, idle, limit).fraction <= spin_fraction


def learn_idle(known: tuple[tuple[int, float], ...], gpu: GpuObservation) -> tuple[tuple[int, float], ...]:
    """The lowest draw seen per GPU index while nothing ran on it (util 0), folded with this poll."""
    idle = dict(known)
    if gpu.status == "ok":
        for d in gpu.devices:
            if d.power_w is not None and d.power_w > 0 and d.util_percent <= IDLE_UTIL_PERCENT:
                idle[d.index] = min(idle.get(d.index, d.power_w), d.power_w)
    return tuple(sorted(idle.items()))


def readings(
    gpu: GpuObservation, idle: tuple[tuple[int, float], ...], idle_override: float | None, indices: Iterable[int]
) -> tuple[PowerReading, ...]:
    """The tree's GPUs that have what the rule needs."""
    learned = dict(idle)
    keep = frozenset(indices)
    out = []
    if gpu.status != "ok":
        return ()
    for d in gpu.devices:
        ref = idle_override if idle_override is not None else learned.get(d.index)
        if d.index in keep and d.power_w is not None and d.power_limit_w is not None and ref is not None:
            out.append(PowerReading(d.index, d.util_percent, d.power_w, ref, d.power_limit_w))
    return tuple(out)


def spinning_by_power(rs: tuple[PowerReading, ...], busy_percent: float, spin_fraction: float) -> PowerReading | None:
    """The first busy GPU drawing near idle, when no busy GPU of the tree draws like work; else None."""
    busy = [r for r in rs if r.util_percent >= busy_percent]
    if not busy or any(r.fraction > spin_fraction for r in busy):
        return None
    return busy[0]


def power_text(r: PowerReading) -> str:
    return (
        f"power: GPU {r.index} util {r.util_percent:.0f} % at {r.power_w:.0f} W, {r.fraction:.0%} of the way from "
        f"idle {r.idle_w:.0f} W to its {r.limit_w:.0f} W limit"
    )
