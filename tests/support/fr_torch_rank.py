"""One REAL torch rank on the CPU (gloo) for the Flight Recorder tests (issue 35).

`python fr_torch_rank.py RANK WORLD STORE`: joins a gloo process group through a file store, runs
one `all_reduce` with every rank (#1, completed everywhere); rank 0 then issues a second
`all_reduce` (#2) that rank 1 never enters, so rank 0 is left inside it. torch's gloo backend keeps
its Flight Recorder ring (`TORCH_FR_BUFFER_SIZE`), but only ProcessGroupNCCL's heartbeat monitor
reads `TORCH_NCCL_DEBUG_INFO_PIPE_FILE`: this script does what that monitor does (torch's
c10d `dump_on_pipe`): it makes the FIFO `<pipe stem><rank>.pipe`, reads it, and on a write dumps
torch's own ring (`torch._C._distributed_c10d._dump_fr_trace()`, the same pickle the NCCL
path writes) to `<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>`, while the rank keeps waiting.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    pipe = f"{os.environ['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}{rank}.pipe"
    out = f"{os.environ['TORCH_NCCL_DEBUG_INFO_TEMP_FILE']}{rank}"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    dist.all_reduce(torch.ones(8))  # #1: every rank
    pending = dist.all_reduce(torch.ones(8), async_op=True) if rank == 0 else None  # #2: rank 1 never comes
    # torch's first dump in a process imports torch._inductor for its traceback symbolizer (seconds
    # on a loaded CPU); a rank that has dumped once answers the pipe at once, as a long-lived one does.
    torch._C._distributed_c10d._dump_fr_trace()
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    print("ready", flush=True)
    while pending is None or not pending.is_completed():
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            data = b""
        if data:
            tmp = out + ".tmp"
            with open(tmp, "wb") as f:
                f.write(torch._C._distributed_c10d._dump_fr_trace())
            os.rename(tmp, out)
        time.sleep(0.1)
    raise SystemExit("the second all_reduce completed without rank 1")


if __name__ == "__main__":
    main()
