"""`ModelRunner.init_attention_backends`, where the H200 run put nvidia-resiliency-ext's LOCK_GIL
fault (REAL_SGLANG.md): libc `sleep` through `ctypes.PyDLL`, which keeps the GIL while it sleeps."""

from __future__ import annotations

import ctypes
from typing import NoReturn


class ModelRunner:
    def init_attention_backends(self) -> NoReturn:
        libc = ctypes.PyDLL(None)  # PyDLL, not CDLL: the call keeps the GIL
        while True:
            libc.sleep(3600)
