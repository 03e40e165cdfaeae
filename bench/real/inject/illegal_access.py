"""A real GPU fault inside real SGLang: an illegal memory access from a small kernel that writes
address 0 (CuPy's RawKernel where CuPy is installed, as on the device image; a Triton kernel reading
address 0 otherwise), launched from SGLang's `ModelRunner.forward` once the server serves (issue 24).

Armed by `REAL_FAULT=illegal_access` in the server's environment (imported by sitecustomize.py).
The fault fires at the first forward after the file `REAL_FAULT_TRIGGER` exists (the recipe
creates it once the daemon says `ready`), in rank `REAL_FAULT_RANK` (default 0), once across
relaunches (`REAL_FAULT_ONCE` names the marker file); `REAL_FAULT_ONSET` receives the wall time.
The driver reports an Xid (13 or 31 on an H200) and the CUDA context of that rank dies with
`an illegal memory access was encountered`; the daemon is never told.
"""

from __future__ import annotations

import os
import time

from onimport import after_import

_TARGET = "sglang.srt.model_executor.model_runner"


def _armed() -> bool:
    once = os.environ.get("REAL_FAULT_ONCE")
    return os.environ.get("REAL_FAULT") == "illegal_access" and not (once and os.path.exists(once))


def _due() -> bool:
    trigger = os.environ.get("REAL_FAULT_TRIGGER")
    if not _armed() or (trigger and not os.path.exists(trigger)):
        return False
    try:
        import torch.distributed as dist

        rank = str(dist.get_rank()) if dist.is_initialized() else "0"
    except Exception:
        rank = "0"
    return rank == os.environ.get("REAL_FAULT_RANK", "0")


def _fault() -> None:
    import torch

    for name in ("REAL_FAULT_ONCE", "REAL_FAULT_ONSET"):
        path = os.environ.get(name)
        if path:
            with open(path, "w") as f:
                f.write(repr(time.time()) if name == "REAL_FAULT_ONSET" else str(os.getpid()))
    try:  # CuPy (on the device image) shares torch's primary context: measured to raise Xid 31 there
        import cupy
        import numpy

        bad = cupy.RawKernel('extern "C" __global__ void bad(unsigned long long a){ *((volatile int*)a) = 1; }', "bad")
        bad((1,), (1,), (numpy.uint64(0),))
    except ImportError:
        import triton
        import triton.language as tl

        @triton.jit
        def read_null(out_ptr):  # type: ignore[no-untyped-def]
            null = tl.full((1,), 0, tl.int64).to(tl.pointer_type(tl.float32))
            tl.store(out_ptr + tl.arange(0, 1), tl.load(null))

        out = torch.empty(1, dtype=torch.float32, device="cuda")
        read_null[(1,)](out)
    torch.cuda.synchronize()  # raises: an illegal memory access was encountered


def _wrap(module: object) -> None:
    runner = getattr(module, "ModelRunner", None)
    original = getattr(runner, "forward", None)
    if runner is None or original is None:
        return

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if _due():
            _fault()
        return original(self, *args, **kwargs)

    runner.forward = forward


if _armed():
    after_import(_TARGET, _wrap)
