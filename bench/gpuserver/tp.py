"""SGLang's tensor parallelism in miniature: one process per rank, all-reduces in a loop, one rank that can drop out.

    python -m bench.gpuserver.tp --tp-size 2 --backend nccl --host 127.0.0.1 --port 30000   # one GPU per rank
    python -m bench.gpuserver.tp --tp-size 2 --backend gloo ...                             # CPU only

The main process spawns `--tp-size` ranks titled `sglang::scheduler_TP{n}`; each joins a
torch.distributed group (NCCL on GPU `n`, with NVLink multicast off; or gloo on the CPU), loads
"weights" (`GPU_TP_WEIGHTS_GB` per rank on its GPU; a small host buffer with gloo), then warms up
with `GPU_TP_STEPS` all-reduces, rank 0 logging each. With `GPU_TP_STALL_RANK=k` rank k stops
taking part after `GPU_TP_STALL_AFTER` steps: the others wait in the next all-reduce for ever (the
process group's timeout is an hour), the way a TP group hangs when one rank is stuck elsewhere.
Otherwise every rank reports ready and the main process serves `/health` like the single-GPU server.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import threading
import time
from typing import Any, NoReturn

from bench.gpuserver.common import GB, become_child, child_argv, log, write_status
from bench.gpuserver.server import serve_http, wait_ready

# NVLink multicast can take a shared host's GPUs out of service: never on, whatever the caller's environment.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ---- a rank -------------------------------------------------------------------------------------


def _all_reduce_step(dist: Any, torch: Any, buf: Any, on_gpu: bool) -> None:
    """One tensor-parallel all-reduce, waited for: NCCL returns at once, so the host waits on the stream."""
    dist.all_reduce(buf)
    if on_gpu:
        torch.cuda.synchronize()


def _stop_taking_part(status_file: str | None, rank: int, step: int) -> NoReturn:
    """This rank is stuck elsewhere (here: on an event nobody sets); its peers wait in the collective."""
    write_status(status_file, rank=rank, step=step, onset_wall=time.time(), onset_monotonic=time.monotonic())
    never = threading.Event()
    while True:
        never.wait(3600)


def run_rank(rank: int, world: int, backend: str, dist_port: int, ready_fd: int) -> NoReturn:
    tag = f"TP{rank}"
    become_child(f"sglang::scheduler_{tag}")
    os.environ.update(NO_MULTICAST)
    steps = int(os.environ.get("GPU_TP_STEPS", "40"))
    stall_rank = int(os.environ.get("GPU_TP_STALL_RANK", "-1"))
    stall_after = int(os.environ.get("GPU_TP_STALL_AFTER", "20"))
    status_file = os.environ.get("GPU_TP_ONSET_FILE") or None

    log("Init torch distributed begin.", tag)
    import torch  # type: ignore[import-not-found, unused-ignore]
    import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]

    on_gpu = backend == "nccl"
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{dist_port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(hours=1),
        **({"device_id": device} if on_gpu else {}),
    )
    log("Init torch distributed ends. mem usage=0.00 GB", tag)
    if on_gpu:
        free, _total = torch.cuda.mem_get_info()
        nbytes = int(min(float(os.environ.get("GPU_TP_WEIGHTS_GB", "20")) * GB, free // 2))
    else:
        free, nbytes = 0, 64 * 1024**2
    log(f"Load weight begin. avail mem={free / GB:.2f} GB", tag)
    weights = torch.empty(nbytes, dtype=torch.uint8, device=device)
    weights.fill_(1)
    log(f"Load weight end. type=GpuTpForCausalLM, dtype=torch.bfloat16, mem usage={nbytes / GB:.2f} GB.", tag)
    buf = torch.ones((16 if on_gpu else 1) * 1024 * 1024 // 4, dtype=torch.float32, device=device)
    log("KV Cache is allocated. #tokens: 65536, K size: 0.50 GB, V size: 0.50 GB", tag)
    for step in range(1, steps + 1):
        if rank == stall_rank and step > stall_after:
            _stop_taking_part(status_file, rank, step)
        _all_reduce_step(dist, torch, buf, on_gpu)
        buf.fill_(1.0)
        if rank == 0:
            log(f"Prefill warm-up batch {step}/{steps}, #all-reduce: {step}", tag)
        time.sleep(0.05)
    os.write(ready_fd, b"ready\n")
    os.close(ready_fd)
    del weights
    never = threading.Event()
    while True:
        never.wait(3600)


# ---- the main process ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.gpuserver.tp")
    parser.add_argument("--model-path", default="gpu-tp")
    parser.add_argument("--tp-size", type=int, default=2)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default=os.environ.get("GPU_TP_BACKEND", "nccl"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dist-port", type=int, default=None, help=argparse.SUPPRESS)
    args, _unknown = parser.parse_known_args(argv)
    if args.rank is not None:
        run_rank(args.rank, args.tp_size, args.backend, args.dist_port, args.fd)
    os.environ.update(NO_MULTICAST)
    log(f"server_args=ServerArgs(model_path='{args.model_path}', tp_size={args.tp_size}, port={args.port})")
    dist_port = _free_port()
    readers, ranks = [], []
    for rank in range(args.tp_size):
        read_fd, write_fd = os.pipe()
        rank_args = ["--rank", str(rank), "--fd", str(write_fd), "--dist-port", str(dist_port)]
        rank_args += ["--tp-size", str(args.tp_size), "--backend", args.backend]
        cmd, exe, extra = child_argv(f"sglang::scheduler_TP{rank}", "bench.gpuserver.tp", rank_args)
        ranks.append(subprocess.Popen(cmd, executable=exe, env={**os.environ, **extra}, pass_fds=(write_fd,)))
        os.close(write_fd)
        readers.append(read_fd)
    for rank, read_fd in enumerate(readers):
        if not wait_ready(read_fd):
            log(f"Rank {rank} scheduler is dead. exit code {ranks[rank].wait()}")
            return 1
    serve_http(args.host, args.port, args.model_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
