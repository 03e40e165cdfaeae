"""A busy hang in real SGLang's draft CUDA-graph capture (issue 22), armed through the server's env.

With `REAL_FAULT=busy_capture`, the first call of SGLang 0.5.16's
`EAGLEDraftCudaGraphRunner.capture_one_shape` (`sglang/srt/speculative/eagle_draft_cuda_graph_runner.py`,
reached from `DecodeCudaGraphRunner.capture`) first launches a kernel that never ends
(`torch.cuda._sleep(1 << 62)`: ~70 years of GPU clock cycles) on the current stream, outside any
stream capture, then waits for it with `torch.cuda.Event.synchronize`: the scheduler spins one core
in the driver, NVML says 100 %, GPM SM activity stays near 0, no line, no memory change, no port
(REAL_SGLANG.md measured exactly this). `REAL_FAULT_ONCE` makes it one-shot across relaunches;
`REAL_FAULT_ONSET` receives the wall time the wait began (read only by the recipe). Loaded by a
one-line import in `sitecustomize.py`; without `REAL_FAULT=busy_capture` it does nothing.
"""

from __future__ import annotations

import os
import time

from onimport import after_import

_TARGET = "sglang.srt.speculative.eagle_draft_cuda_graph_runner"
NEVER = 1 << 62  # clock cycles for torch.cuda._sleep


def _armed() -> bool:
    once = os.environ.get("REAL_FAULT_ONCE")
    return os.environ.get("REAL_FAULT") == "busy_capture" and not (once and os.path.exists(once))


def _spin_on_the_gpu() -> None:
    import torch

    for name in ("REAL_FAULT_ONCE", "REAL_FAULT_ONSET"):
        path = os.environ.get(name)
        if path:
            with open(path, "w") as f:
                f.write(repr(time.time()) if name == "REAL_FAULT_ONSET" else str(os.getpid()))
    torch.cuda._sleep(NEVER)  # a kernel that never finishes
    done = torch.cuda.Event()
    done.record()
    done.synchronize()  # spins in the driver forever


def _wrap(module: object) -> None:
    runner = getattr(module, "EAGLEDraftCudaGraphRunner", None)
    original = getattr(runner, "capture_one_shape", None)
    if runner is None or original is None:
        return

    def capture_one_shape(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if _armed():
            _spin_on_the_gpu()
        return original(self, *args, **kwargs)

    runner.capture_one_shape = capture_one_shape


if _armed():
    after_import(_TARGET, _wrap)
