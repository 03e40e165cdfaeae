"""Fault injection for real SGLang, carried on the server's PYTHONPATH only (the daemon is not told).

Python imports `sitecustomize` at start in every process of the tree, schedulers included (they are
spawned interpreters). With `REAL_FAULT=kv_deadlock`, the first call of SGLang's
`ModelRunner.alloc_memory_pool` (after the weights are loaded, before the KV cache exists) blocks
forever on a lock its own thread already holds: a real lock deadlock inside a real SGLang function,
the seed incident's shape (weights in memory, no port, no log line). `REAL_FAULT_RANK` limits it to
one tensor-parallel rank; `REAL_FAULT_ONCE` names a file that makes the fault one-shot across
relaunches (a transient fault); `REAL_FAULT_ONSET` receives the wall time the block began, read only
by the recipe to time detection.
"""

from __future__ import annotations

import os
import threading
import time

from onimport import after_import

_TARGET = "sglang.srt.model_executor.model_runner"


def _armed() -> bool:
    once = os.environ.get("REAL_FAULT_ONCE")
    return os.environ.get("REAL_FAULT") == "kv_deadlock" and not (once and os.path.exists(once))


def _rank() -> str:
    """This process's rank in torch.distributed (initialised before the weights load), else ''."""
    try:
        import torch.distributed as dist

        return str(dist.get_rank()) if dist.is_initialized() else ""
    except Exception:
        return ""


def _wrap(module: object) -> None:
    runner = getattr(module, "ModelRunner", None)
    original = getattr(runner, "alloc_memory_pool", None)
    if runner is None or original is None:
        return

    def alloc_memory_pool(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        rank = os.environ.get("REAL_FAULT_RANK")
        if _armed() and (rank is None or _rank() == rank):
            once = os.environ.get("REAL_FAULT_ONCE")
            if once:
                with open(once, "w") as f:
                    f.write(str(os.getpid()))
            onset = os.environ.get("REAL_FAULT_ONSET")
            if onset:
                with open(onset, "w") as f:
                    f.write(repr(time.time()))
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # never returns: the thread waits on itself
        return original(self, *args, **kwargs)

    runner.alloc_memory_pool = alloc_memory_pool


if _armed():
    after_import(_TARGET, _wrap)
import busyhang  # noqa: E402,F401 -- issue 22's fault: REAL_FAULT=busy_capture, a kernel that never ends in capture
import illegal_access  # noqa: E402,F401 -- issue 24's fault: REAL_FAULT=illegal_access (illegal_access.py)
import lockgil  # noqa: E402,F401 -- issue 35's fault: REAL_FAULT_GIL=1, the GIL held in native sleep after load
import vllmhang  # noqa: E402,F401 -- issue 37: REAL_FAULT=vllm_kv_deadlock, real vLLM deadlocked after its weights load
