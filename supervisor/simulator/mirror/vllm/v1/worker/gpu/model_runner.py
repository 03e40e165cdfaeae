"""`GPUModelRunner.load_model` of vLLM 0.26.0's V2 runner (`vllm/v1/worker/gpu/model_runner.py:276`), where
nvidia-resiliency-ext's LOCK_GIL fault is placed in vLLM mode: libc `sleep` through `ctypes.PyDLL`,
which keeps the GIL while it sleeps, so no other thread of the process runs Python."""

from __future__ import annotations

import ctypes
from typing import NoReturn


class GPUModelRunner:
    def load_model(self) -> NoReturn:
        libc = ctypes.PyDLL(None)  # PyDLL, not CDLL: the call keeps the GIL
        while True:
            libc.sleep(3600)
