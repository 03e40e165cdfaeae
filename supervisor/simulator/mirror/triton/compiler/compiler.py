"""triton.compiler.compile's shape: lowering a kernel is CPU work in the compiling process."""

from __future__ import annotations

import hashlib
import time


def compile(src: str, seconds: float) -> str:
    """Lower `src` for `seconds` of CPU (hashing stands in for the passes); returns the binary's key."""
    deadline = time.monotonic() + seconds
    key = hashlib.sha256(src.encode()).digest()
    while time.monotonic() < deadline:
        for _ in range(200):
            key = hashlib.sha256(key).digest()
    return key.hex()
