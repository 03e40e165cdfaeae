"""One rank of a real NCCL process group with PyTorch's Flight Recorder on (issue 35's H200 check):
`python -m bench.real.frprobe N` with the launch variables of supervisor.diagnostics.flightrec in
its environment; init_process_group("nccl", world 1), N all-reduces, prints "ready", then lives
(its heartbeat monitor reads the FR pipe each second) until killed. Needs torch with CUDA."""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    import torch
    import torch.distributed as dist

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(n):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    print("ready", torch.__version__, flush=True)
    while True:
        time.sleep(1.0)


if __name__ == "__main__":
    main()
