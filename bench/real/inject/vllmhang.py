"""The seed incident's shape in real vLLM 0.26.0 (issue 37), armed through the server's env: with
`REAL_FAULT=vllm_kv_deadlock`, the first call of vLLM's `Worker.determine_available_memory` (the
profiling run that sizes the KV cache, right after "Model loading took") blocks for good on a lock its
own thread already holds: weights in memory, no port, no log line. At tensor-parallel size 1 the
worker lives inside `VLLM::EngineCore` (the uni-process executor). `REAL_FAULT_ONCE` makes it one-shot
across relaunches; `REAL_FAULT_ONSET` receives the wall time the block began (read only by the recipe,
never by the daemon). Loaded by a one-line import in sitecustomize.py.
"""

from __future__ import annotations

import os
import threading
import time

from onimport import after_import

_TARGET = "vllm.v1.worker.gpu_worker"


def _armed() -> bool:
    once = os.environ.get("REAL_FAULT_ONCE")
    return os.environ.get("REAL_FAULT") == "vllm_kv_deadlock" and not (once and os.path.exists(once))


def _wrap(module: object) -> None:
    worker = getattr(module, "Worker", None)
    original = getattr(worker, "determine_available_memory", None)
    if worker is None or original is None:
        return

    def determine_available_memory(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if _armed():
            for name in ("REAL_FAULT_ONCE", "REAL_FAULT_ONSET"):
                path = os.environ.get(name)
                if path:
                    with open(path, "w") as f:
                        f.write(repr(time.time()) if name.endswith("ONSET") else str(os.getpid()))
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # never returns: the thread waits on itself
        return original(self, *args, **kwargs)

    worker.determine_available_memory = determine_available_memory


if _armed():
    after_import(_TARGET, _wrap)
