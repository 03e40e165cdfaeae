"""An orphan process titled like SGLang's (`sglang::scheduler_TP0`), its output going to a given log."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

_ORPHAN = """
import os, sys
log, title = sys.argv[1], sys.argv[2]
pid = os.fork()
if pid == 0:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.execvp("sleep", [title, "300"])
print(pid, flush=True)
"""


def spawn_orphan(log: Path, title: str = "sglang::scheduler_TP0") -> int:
    """A process titled like SGLang's, writing to `log`, whose parent has exited (exact pid known)."""
    out = subprocess.run([sys.executable, "-c", _ORPHAN, str(log), title], capture_output=True, text=True, check=True)
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # until the exec took effect
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(title.encode()):
                return pid
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"orphan {pid} never became {title}")
