"""Issue 36: why a relaunch's warm-up request took 115-119 s on the H200 (real SGLang 0.5.16).

In lane `fast` (and after the Xid of lane `xid`) the relaunched server's own warm-up request (`POST
/generate` after `Uvicorn running`, which ends in `The server is fired up`) took 115.7 s, against
4.1 s on the cold start. Both slow cases had 4 clients posting to the port while the server came
back; the cold start had none. This script tests that alone, with no daemon: real SGLang launched
three or four times on one kernel cache, each time timing `Uvicorn running` -> `fired up` and the
longest silence of the log in between:

  cold   (fresh cache, no clients)
  warm+load (cache warm, 4 clients retrying from the moment of the launch, as a load balancer would)
  warm   (cache warm, no clients)
  warm+load again, when time is left

    python3 -m bench.real.warmrace --real /tmp/real --out OUT     # after `run setup`; one H200, ~6 min
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.real import configs
from bench.real.lab import Load, free_port

STAMP = re.compile(rb"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
CACHE_VARS = (
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TVM_FFI_CACHE_DIR",
    "SGLANG_DG_CACHE_DIR",
    "TILELANG_CACHE_DIR",
    "CUTE_DSL_CACHE_DIR",
)


def _argv(models: Path, port: int) -> list[str]:
    argv = configs.server_command()
    for key, value in configs.base_args(models).items():
        if value is True:
            argv.append(f"--{key}")
        elif value is not False:
            argv += [f"--{key}", str(value)]
    return [*argv, "--host", "127.0.0.1", "--port", str(port)]


def _env(real: Path, cache: Path) -> dict[str, str]:
    env = {**os.environ, **configs.server_env(real, "0")}
    for var in CACHE_VARS:
        env[var] = str(cache / var.lower())
    env["FLASHINFER_WORKSPACE_BASE"] = str(cache / "flashinfer")
    return env


def _lines(log: Path) -> list[tuple[float, bytes]]:
    out: list[tuple[float, bytes]] = []
    for raw in log.read_bytes().splitlines():
        m = STAMP.match(raw)
        if m:
            out.append((time.mktime(time.strptime(m.group(1).decode(), "%Y-%m-%d %H:%M:%S")), raw))
    return out


def one(name: str, real: Path, models: Path, cache: Path, work: Path, load: bool, deadline: float) -> dict[str, Any]:
    port = free_port()
    log = work / f"{name}.log"
    t0 = time.time()
    with log.open("wb") as f:
        proc = subprocess.Popen(
            _argv(models, port), env=_env(real, cache), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    clients = Load(port) if load else None
    uvicorn = ready = None
    while time.time() < deadline and proc.poll() is None:
        text = log.read_bytes()
        if uvicorn is None and b"Uvicorn running" in text:
            uvicorn = time.time()
        if b"fired up and ready to roll" in text:
            ready = time.time()
            break
        time.sleep(0.2)
    if clients is not None:
        clients._stop.set()  # the threads are daemons; a request in flight ends with the kill
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    time.sleep(3.0)  # the GPU's memory back before the next launch
    lines = _lines(log)
    after = [t for t, raw in lines if uvicorn is not None and t >= int(uvicorn) - 1]
    gaps = [b - a for a, b in itertools.pairwise(after)]
    return {
        "case": name,
        "load": load,
        "port": port,
        "launch_to_uvicorn_s": round(uvicorn - t0, 1) if uvicorn else None,
        "uvicorn_to_ready_s": round(ready - uvicorn, 1) if (ready and uvicorn) else None,
        "launch_to_ready_s": round(ready - t0, 1) if ready else None,
        "longest_log_silence_after_uvicorn_s": max(gaps) if gaps else None,
        "client_requests_ok": clients.ok if clients else 0,
        "client_requests_failed": clients.failed if clients else 0,
        "disconnect_lines": sum(1 for _, raw in lines if b"disconnected from the client side" in raw),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", type=Path, default=Path("/tmp/real"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=540.0)
    args = ap.parse_args()
    deadline = time.time() + args.budget
    work = args.out / "warmrace"
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    models = args.real / "models"
    results: list[dict[str, Any]] = []
    for name, load, needs in (
        ("cold", False, 200),
        ("warm_load", True, 200),
        ("warm", False, 110),
        ("warm_load_again", True, 150),
    ):
        if time.time() + needs > deadline:
            results.append({"case": name, "skipped": "no time left"})
            continue
        results.append(one(name, args.real, models, cache, work, load, deadline))
        (args.out / "warmrace.json").write_text(json.dumps(results, indent=1))
        print(json.dumps(results[-1]), flush=True)


if __name__ == "__main__":
    main()
