"""The daemon configs the real-SGLang scenarios run under: the EAGLE-3 base rung of REAL_SGLANG.md and
the fallback rungs real users needed, with the sglang bundle only in the server's environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from bench.real.lab import ROOT, SAFE_ENV

SPEC_KEYS = ["speculative-algorithm", "speculative-draft-model-path", "speculative-num-steps",
             "speculative-eagle-topk", "speculative-num-draft-tokens"]


def base_args(models: Path, *, tp: int = 1, piecewise: bool = False, mem: float = 0.25) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model-path": str(models / "target"),
        "tp-size": tp,
        "skip-tokenizer-init": True,
        "attention-backend": "triton",
        "sampling-backend": "pytorch",
        "grammar-backend": "none",
        "mem-fraction-static": mem,
        "enable-metrics": True,
        "cuda-graph-max-bs": 8,
        "speculative-algorithm": "EAGLE3",
        "speculative-draft-model-path": str(models / "draft"),
        "speculative-num-steps": 3,
        "speculative-eagle-topk": 1,
        "speculative-num-draft-tokens": 4,
    }
    if not piecewise:
        args["disable-piecewise-cuda-graph"] = True
    return args


FALLBACKS = [
    {"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}, "drop": ["cuda-graph-max-bs"],
     "on": ["cuda_graph_capture"]},
    {"name": "no-speculation", "drop": SPEC_KEYS, "on": ["spec_regression"]},
]


def server_env(real: Path, gpus: str, extra: dict[str, str] | None = None, inject: bool = False) -> dict[str, str]:
    path = [str(ROOT / "bench" / "real" / "inject")] if inject else []
    sim = {"PYTHONPATH": str(ROOT), "SGLANG_SIM_PACE": "0.2"} if os.environ.get("REAL_SIMULATE") == "1" else {}
    return {
        "PYTHONPATH": ":".join([*path, str(real / "site")]),
        **sim,
        "CUDA_VISIBLE_DEVICES": gpus,
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{real / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        **SAFE_ENV,
        **(extra or {}),
    }


def daemon_env(real: Path) -> dict[str, str]:
    """The daemon's own environment: the bundle for fastapi/pydantic/structlog, then the repo."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",)}
    env["PYTHONPATH"] = f"{real / 'site'}:{ROOT}"
    env["PATH"] = f"{real / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(SAFE_ENV)
    return env


def cuda_gdb() -> str | None:
    for p in ("/usr/local/cuda/bin/cuda-gdb", "/opt/nvidia/cuda/bin/cuda-gdb"):
        if os.access(p, os.X_OK):
            return p
    return None


def server_command() -> list[str]:
    """Real SGLang; with REAL_SIMULATE=1, the built-in simulator (to check the recipe on a CPU machine)."""
    if os.environ.get("REAL_SIMULATE") == "1":
        return [sys.executable, "-m", "supervisor.simulator"]
    return [sys.executable, "-m", "sglang.launch_server"]


def config(
    real: Path,
    models: Path,
    *,
    gpus: str,
    watchdog: dict[str, Any],
    tp: int = 1,
    piecewise: bool = False,
    mem: float = 0.25,
    env_extra: dict[str, str] | None = None,
    inject: bool = False,
    fallbacks: bool = True,
) -> dict[str, Any]:
    diagnostics: dict[str, Any] = {"py_spy": True, "native": True, "gdb": "on_hang",
                                   "py_spy_path": str(real / "bin" / "py-spy")}
    gdb = cuda_gdb()
    if gdb:
        diagnostics["gdb_path"] = gdb
    cfg: dict[str, Any] = {
        "server": {
            "command": server_command(),
            "host": "127.0.0.1",
            "port": 0,  # filled by the caller
            "env": server_env(real, gpus, env_extra, inject),
            "args": base_args(models, tp=tp, piecewise=piecewise, mem=mem),
        },
        "watchdog": watchdog,
        "restart": {"retries_per_rung": 1, "backoff_initial_s": 1.0, "backoff_max_s": 10.0,
                    "max_restarts_per_hour": 30, "stop_grace_s": 5.0, "release_timeout_s": 30.0,
                    "start_from": "preferred"},
        "diagnostics": diagnostics,
    }
    if fallbacks:
        cfg["fallback"] = FALLBACKS
    return cfg


# Windows short enough for a 10-minute device call; `shipped` keeps every default (scenario b).
FAST = {"poll_interval_s": 1.0, "startup_stall_s": 60.0, "serving_stall_s": 10.0, "health_interval_s": 2.0,
        "health_timeout_s": 30.0, "health_failures": 3, "metrics_interval_s": 1.0, "spec_window_s": 30.0,
        "on_spec_regression": "alert"}
