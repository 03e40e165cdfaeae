"""`[learned]` and `[caches]`: back to serving fast (issue 36).

`[learned]`: start-up stall windows learned from this host's good starts (supervisor/policy/learned.py
decides, supervisor/warmstart/timeline.py records). `[caches]`: the kernel caches SGLang and its
kernels compile into, pinned under `[paths] cache_dir` (supervisor/warmstart/kernelcache.py), and the
weights' page-cache residency before a relaunch (supervisor/warmstart/residency.py).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class LearnedSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # On: a phase's start-up window is `multiple` x the longest quiet interval seen in that phase
    # on a good start of the same model and rung on this host, at least `floor_s`, at most the
    # configured `[watchdog] startup_stall_s` (the ceiling). NVIDIA resiliency-ext uses about 5x.
    enabled: bool = True
    multiple: Annotated[float, Field(ge=1, le=100)] = 5.0
    floor_s: Annotated[float, Field(gt=0)] = 20.0
    # A model and rung learned from fewer good starts than this keeps the configured window.
    min_starts: Annotated[int, Field(ge=1, le=100)] = 1

    def describe(self, ceiling_s: float) -> str:
        if not self.enabled:
            return f"learned windows off: every phase waits startup_stall_s = {ceiling_s:g} s"
        return (
            f"learned windows: {self.multiple:g} x the longest quiet interval of a phase on good starts of the "
            f"same model and rung on this host, at least {self.floor_s:g} s, at most startup_stall_s = "
            f"{ceiling_s:g} s; an unknown model, rung or host waits {ceiling_s:g} s"
        )


class CachesSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # Pin every kernel cache the operator did not set (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, ...)
    # under [paths] cache_dir/daemon-<identity>/, one directory per model and rung fingerprint.
    pin: bool = True
    # This daemon's caches in cache_dir are pruned to this (least recently used fingerprints first)
    # before a launch; the fingerprint about to launch and other daemons' caches are never pruned.
    max_gb: Annotated[float, Field(gt=0)] = 50.0
    # Before a relaunch: measure how much of the model's weight files is in the page cache (mincore);
    # with `weights_readahead`, ask the kernel to read them ahead (posix_fadvise WILLNEED) while the
    # evidence is captured and the GPUs are released.
    weights_residency: bool = True
    weights_readahead: bool = True
    # Measuring residency maps each file; a directory of more than this many weight files is sampled no further.
    max_weight_files: Annotated[int, Field(ge=1, le=100000)] = 4096
