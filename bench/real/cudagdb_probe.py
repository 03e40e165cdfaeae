"""How long one cuda-gdb attach takes on a torch process, and what each part of the batch costs.

A torch process on the given GPU holds 4 GB, keeps 100 idle threads (a scheduler has ~120) and spins
a GPU kernel (`torch.cuda._sleep`); cuda-gdb attaches to it with the daemon's own batch and with
variants: no symbol loading for shared libraries, and `info cuda kernels` alone. Prints and writes
JSON: seconds, exit code, whether a `#0` frame and the spinning kernel were seen.

    python3 -m bench.real.cudagdb_probe --out DIR [--gdb /usr/local/cuda/bin/cuda-gdb]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from supervisor import diagnostics

TARGET = r"""
import threading, time, torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
ev = threading.Event()
for _ in range(100):
    threading.Thread(target=ev.wait, daemon=True).start()
print("ready", flush=True)
while True:
    torch.cuda._sleep(2_000_000_000)
    torch.cuda.synchronize()
"""

NO_SOLIB = ("-iex", "set auto-solib-add off")
QUIET = ("-iex", "set print thread-events off")
HEAD = ("--batch", "-nx", "-iex", "set debuginfod enabled off", "-iex", "set auto-load no", "-ex", "set pagination off")
KERNELS = ("-ex", "info cuda kernels")


def variants(exe: str, pid: int) -> dict[str, tuple[str, ...]]:
    p = (exe, "-p", str(pid))
    return {
        "daemon": diagnostics.gdb_argv(exe, pid, "cuda-gdb"),
        "no_solib": (*p, *NO_SOLIB, *QUIET, *HEAD, "-ex", "thread apply all bt", *KERNELS),
        "kernels_only": (*p, *QUIET, *HEAD, *KERNELS),
        "kernels_only_no_solib": (*p, *NO_SOLIB, *QUIET, *HEAD, *KERNELS),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gdb", default="/usr/local/cuda/bin/cuda-gdb")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    target = subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True)
    assert target.stdout is not None
    target.stdout.readline()
    time.sleep(2)
    rows = []
    try:
        for rnd in range(args.rounds):
            for name, argv in variants(args.gdb, target.pid).items():
                t0 = time.time()
                env = diagnostics.tool_env(dict(os.environ))
                r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
                dt = round(time.time() - t0, 2)
                kernels = diagnostics.parse_cuda_kernels(r.stdout)
                (args.out / f"{name}-{rnd}.txt").write_text(f"# {' '.join(argv)}\n{r.stdout}\n--- stderr\n{r.stderr}")
                row = {"variant": name, "round": rnd, "seconds": dt, "rc": r.returncode,
                       "frame0": "#0 " in r.stdout, "kernels": list(kernels), "bytes": len(r.stdout)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        target.kill()
    (args.out / "cudagdb.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
