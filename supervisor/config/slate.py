"""`[slate]`: what the clean slate before each launch does about GPU memory that processes outside
the server hold (supervisor/policy/gpufit.py decides, supervisor/daemon/slate.py acts)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

StrangerPolicy = Literal["launch", "wait", "refuse"]


class SlateSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # launch: when the rung's need is free on every server GPU, else wait (refused, retried on the
    # backoff); wait: while any stranger holds memory at all; refuse: any stranger is `failed` now.
    gpu_strangers: StrangerPolicy = "launch"
    # A floor for what one server GPU must have free (GiB); the need is the larger of this and
    # the engine's memory fraction (--mem-fraction-static, --gpu-memory-utilization) x the GPU's total.
    # None: the fraction alone (unknown without it).
    gpu_need_gib: Annotated[float, Field(gt=0, le=4096)] | None = None

    def describe(self) -> str:
        """One line for check-config: the policy in force."""
        floor = "" if self.gpu_need_gib is None else f", at least {self.gpu_need_gib:g} GiB free per GPU"
        if self.gpu_strangers == "launch":
            return (
                'gpu_strangers = "launch": a process outside the server on its GPUs delays a launch only when '
                "the rung's need (its engine's memory fraction, SGLang's --mem-fraction-static or vLLM's "
                f"--gpu-memory-utilization, x the GPU's total{floor}) is not free"
            )
        if self.gpu_strangers == "wait":
            return 'gpu_strangers = "wait": no launch while any process outside the server holds memory on its GPUs'
        return (
            'gpu_strangers = "refuse": any process outside the server holding memory on its GPUs fails the '
            "launch at once (state failed, a notification, the failed cooldown)"
        )
