"""nvidia-resiliency-ext's LOCK_GIL fault in real SGLang after its weights load (issue 35), armed
through the server's env: with `REAL_FAULT_GIL=1`, the first call of SGLang's
`ModelRunner.init_attention_backends` (`init_attention_backend` in older releases) calls libc
`sleep` through `ctypes.PyDLL`, which keeps the GIL: the scheduler's main thread sleeps in
`clock_nanosleep` and no other thread of the rank runs Python (REAL_SGLANG.md's H200 run).
`REAL_FAULT_GIL_ONCE` makes it one-shot across relaunches; `REAL_FAULT_GIL_ONSET` receives the wall
time the sleep began (read only by the recipe). Loaded by a one-line import in sitecustomize.py.
"""

from __future__ import annotations

import ctypes
import os
import time

from onimport import after_import

_TARGET = "sglang.srt.model_executor.model_runner"
_METHODS = ("init_attention_backends", "init_attention_backend")


def _armed() -> bool:
    once = os.environ.get("REAL_FAULT_GIL_ONCE")
    return os.environ.get("REAL_FAULT_GIL") == "1" and not (once and os.path.exists(once))


def _hold_the_gil() -> None:
    for name in ("REAL_FAULT_GIL_ONCE", "REAL_FAULT_GIL_ONSET"):
        path = os.environ.get(name)
        if path:
            with open(path, "w") as f:
                f.write(repr(time.time()) if name.endswith("ONSET") else str(os.getpid()))
    libc = ctypes.PyDLL(None)  # PyDLL, not CDLL: the call keeps the GIL
    while True:
        libc.sleep(3600)


def _wrap(module: object) -> None:
    runner = getattr(module, "ModelRunner", None)
    for method in _METHODS:
        original = getattr(runner, method, None)
        if runner is None or original is None:
            continue

        def patched(self, *args, _original=original, **kwargs):  # type: ignore[no-untyped-def]
            if _armed():
                _hold_the_gil()
            return _original(self, *args, **kwargs)

        setattr(runner, method, patched)


if _armed():
    after_import(_TARGET, _wrap)
