"""What the main process and the scheduler share: settings from the environment, SGLang-shaped log lines,
the status file the harness reads, and taking a `sglang::` process title."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Mode = Literal["serve", "deadlock", "spin"]
Device = Literal["cuda", "cpu"]
GB = 1024**3
MODES: tuple[Mode, ...] = ("serve", "deadlock", "spin")

MODE_ENV = "GPU_SERVER_MODE"
STATUS_ENV = "GPU_SERVER_ONSET_FILE"  # like the simulator's SGLANG_SIM_ONSET_FILE: read by benchmarks only
PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ServerConfig:
    mode: Mode = "serve"
    device: Device = "cuda"  # "cpu": host memory and a host spin, to check the harness without a GPU
    cap_gb: float = 40.0  # never more than this ...
    free_fraction: float = 0.5  # ... nor more than this share of the GPU's free memory
    shards: int = 8
    shard_s: float = 0.25  # pacing of the weight load, so the progress bar moves like a real one
    warmup_s: float = 1.0
    spin_bound_s: float = 90.0  # the GPU spin ends by itself after this, even if nothing kills it
    status_file: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServerConfig:
        mode = env.get(MODE_ENV, "serve")
        if mode not in MODES:
            raise SystemExit(f"{MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
        device = env.get("GPU_SERVER_DEVICE", "cuda")
        if device not in ("cuda", "cpu"):
            raise SystemExit(f"GPU_SERVER_DEVICE={device!r}: expected cuda or cpu")
        return cls(
            mode=mode,
            device=device,  # type: ignore[arg-type]
            cap_gb=float(env.get("GPU_SERVER_WEIGHTS_GB", "40")),
            free_fraction=min(0.5, float(env.get("GPU_SERVER_FREE_FRACTION", "0.5"))),
            shards=max(1, int(env.get("GPU_SERVER_SHARDS", "8"))),
            shard_s=float(env.get("GPU_SERVER_SHARD_S", "0.25")),
            warmup_s=float(env.get("GPU_SERVER_WARMUP_S", "1.0")),
            spin_bound_s=min(120.0, float(env.get("GPU_SERVER_SPIN_BOUND_S", "90"))),
            status_file=env.get(STATUS_ENV) or None,
        )


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def log(message: str, rank: str = "") -> None:
    """One SGLang log record on stderr: `[2026-11-29 14:45:01 TP0] message`."""
    tag = f" {rank}" if rank else ""
    sys.stderr.write(f"[{stamp()}{tag}] {message}\n")
    sys.stderr.flush()


def write_status(path: str | None, **fields: object) -> None:
    """Atomically write the JSON side file the harness reads (never the daemon); no-op without a path."""
    if not path:
        return
    record = {"onset_wall": None, "onset_monotonic": None, **fields}
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".status-", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def _prctl(option: int, arg: int | bytes) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(option, arg, 0, 0, 0)
    except OSError:
        pass


def have_setproctitle() -> bool:
    try:
        import setproctitle  # noqa: F401
    except ImportError:
        return False
    return True


def child_argv(title: str, module: str, args: Sequence[str]) -> tuple[list[str], str, dict[str, str]]:
    """(argv, executable, extra env) that start `python -m module args` as a child titled `title`.

    With setproctitle the child renames itself (`become_child`). Without it the child is started
    with `title` as its argv[0] (the daemon reads /proc/<pid>/cmdline); such a Python cannot find
    its virtual environment from argv[0], so it gets this interpreter's sys.path in PYTHONPATH.
    """
    if have_setproctitle():
        return [sys.executable, "-m", module, *args], sys.executable, {}
    path = os.pathsep.join(p for p in sys.path if p)
    return [title, "-m", module, *args], sys.executable, {"PYTHONPATH": path}


def become_child(title: str) -> None:
    """Take SGLang's process title, and die with the parent (PR_SET_PDEATHSIG=SIGKILL) as SGLang's children do."""
    if have_setproctitle():
        import setproctitle

        setproctitle.setproctitle(title)
    _prctl(PR_SET_NAME, title.encode()[:15])
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
