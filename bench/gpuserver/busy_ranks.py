"""Eight ranks that hold GPU memory and keep a kernel busy each, for bench/gpu_ranks.py.

    python -m bench.gpuserver.busy_ranks --ranks 8 --gb 2 --ready DIR

The main process spawns `--ranks` children titled `sglang::scheduler_TP{n}` (so the daemon's tree
probe gives them SGLang's roles); each allocates `--gb` GB on GPU `n % device_count`, launches
`torch.cuda._sleep` kernels back to back (a GPU that is busy and never finishes, as a rank spinning
in a collective does) and waits in `torch.cuda.synchronize()`. Each writes `DIR/rank-N` when its
kernel runs. Without torch or a GPU (`--cpu`), the children spin on the CPU in Python instead.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path


def _rank(n: int, gb: float, ready: str, cpu: bool) -> None:
    from setproctitle import setproctitle

    setproctitle(f"sglang::scheduler_TP{n}")
    if cpu:
        Path(ready, f"rank-{n}").write_text(str(os.getpid()))
        x = 0
        while True:  # busy on the CPU, in Python
            x = (x + 1) % 1000003
    import torch

    dev = n % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    _hold = torch.empty(int(gb * 1024**3), dtype=torch.uint8, device="cuda")
    cycles = int(1.9e9 * 3600)  # about an hour of clock cycles per kernel
    torch.cuda._sleep(cycles)
    Path(ready, f"rank-{n}").write_text(str(os.getpid()))
    while True:
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--gb", type=float, default=2.0)
    p.add_argument("--ready", required=True)
    p.add_argument("--cpu", action="store_true")
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(n, a.gb, a.ready, a.cpu), daemon=True) for n in range(a.ranks)]
    for proc in procs:
        proc.start()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while all(proc.is_alive() for proc in procs):
        time.sleep(0.5)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
