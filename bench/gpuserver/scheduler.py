"""The one scheduler (`sglang::scheduler_TP0`): loads "weights" and a KV cache onto the GPU, warms up,
then serves, deadlocks, or spins, by `GPU_SERVER_MODE`.

Run by `bench.gpuserver.server` as `python -m bench.gpuserver.scheduler --fd N`; it tells the main
process it is ready by writing a line to that pipe, which in the two hang modes never happens.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import NoReturn

from bench.gpuserver.common import GB, ServerConfig, become_child, log, write_status
from bench.gpuserver.devices import Memory, memory_for

RANK = "TP0"
TITLE = "sglang::scheduler_TP0"
_weights_lock = threading.Lock()
_kv_pool_lock = threading.Lock()
_held: list[object] = []  # the weights and KV cache: allocated once, kept whatever happens next


def _bar(done: int, total: int, started: float) -> None:
    """tqdm's shape as SGLang's loader prints it: refreshed with a carriage return, on stderr."""
    elapsed = max(time.monotonic() - started, 1e-6)
    rate = done / elapsed
    left = (total - done) / rate if rate else 0.0
    line = (
        f"Loading safetensors checkpoint shards: {100 * done / total:3.0f}% Completed | {done}/{total} "
        f"[{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}<{int(left) // 60:02d}:{int(left) % 60:02d}, "
        f"{rate:5.2f}it/s]"
    )
    sys.stderr.write("\r" + line + ("\n" if done == total else ""))
    sys.stderr.flush()


def _load_weights(mem: Memory, nbytes: int, shards: int, shard_s: float) -> list[object]:
    per = nbytes // shards
    held: list[object] = []
    started = time.monotonic()
    _bar(0, shards, started)
    for i in range(shards):
        held.append(mem.alloc(per, i + 1))
        time.sleep(shard_s)
        _bar(i + 1, shards, started)
    return held


def _sync_weights_to_graph_pool(both_held: threading.Barrier) -> None:
    with _weights_lock:
        both_held.wait()
        with _kv_pool_lock:  # held by _init_kv_pool_views, which waits for _weights_lock
            pass


def _init_kv_pool_views(both_held: threading.Barrier) -> None:
    with _kv_pool_lock:
        both_held.wait()
        with _weights_lock:  # held by _sync_weights_to_graph_pool, which waits for _kv_pool_lock
            pass


def _deadlock() -> NoReturn:
    """Lock-order inversion: both threads sit in a futex wait, the main thread waits in join. 0 % CPU."""
    both_held = threading.Barrier(2)
    workers = [
        threading.Thread(target=_sync_weights_to_graph_pool, args=(both_held,), name="weight-sync", daemon=True),
        threading.Thread(target=_init_kv_pool_views, args=(both_held,), name="kv-pool-init", daemon=True),
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    raise SystemExit(3)


def _wait_for_peer_flag(mem: Memory) -> NoReturn:
    """A GPU kernel polls a flag no peer will set; the host waits for it in the driver. 100 % GPU."""
    mem.spin()
    raise SystemExit(3)  # reached only when the kernel's own bound ran out


def _serve_forever(ready_fd: int) -> NoReturn:
    os.write(ready_fd, b"ready\n")
    os.close(ready_fd)
    idle = threading.Event()
    while True:
        idle.wait(3600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang::scheduler_TP0")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--main-pid", type=int, default=os.getppid())
    args = parser.parse_args(argv)
    become_child(TITLE)
    # A scheduler busy in a hung call does not act on SIGTERM: the stop must escalate (or the parent's death kill it).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cfg = ServerConfig.from_env(os.environ)
    mem = memory_for(cfg.device)

    log("Init torch distributed begin.", RANK)
    mem.init()
    log("Init torch distributed ends. mem usage=0.00 GB", RANK)
    free = mem.free_bytes()
    budget = int(min(cfg.cap_gb * GB, cfg.free_fraction * free))
    weight_bytes = budget * 4 // 5
    kv_bytes = budget - weight_bytes
    log(f"Load weight begin. avail mem={free / GB:.2f} GB", RANK)
    weights = _load_weights(mem, weight_bytes, cfg.shards, cfg.shard_s)
    after = mem.free_bytes()
    log(
        "Load weight end. type=GpuBenchForCausalLM, dtype=torch.bfloat16, "
        f"avail mem={after / GB:.2f} GB, mem usage={weight_bytes / GB:.2f} GB.",
        RANK,
    )
    kv = mem.alloc(kv_bytes, 0)
    tokens = kv_bytes // (2 * 64 * 1024)
    half = kv_bytes / 2 / GB
    log(f"KV Cache is allocated. #tokens: {tokens}, K size: {half:.2f} GB, V size: {half:.2f} GB", RANK)
    log(f"Memory pool end. avail mem={mem.free_bytes() / GB:.2f} GB", RANK)
    mem.warm_up(cfg.warmup_s)
    mem.prepare_spin(cfg.spin_bound_s)
    log(
        f"max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        f"max_running_requests=256, context_len=32768, available_gpu_mem={mem.free_bytes() / GB:.2f} GB",
        RANK,
    )
    status = {
        "mode": cfg.mode,
        "device": mem.name,
        "main_pid": args.main_pid,
        "scheduler_pid": os.getpid(),
        "allocated_bytes": (weight_bytes // cfg.shards) * cfg.shards + kv_bytes,
        "free_before_bytes": free,
        "spinner": mem.spinner,
        "runtime": mem.runtime,
    }
    _held.extend((weights, kv))
    if cfg.mode == "serve":
        write_status(cfg.status_file, **status)
        _serve_forever(args.fd)
    now_wall, now_mono = time.time(), time.monotonic()
    write_status(cfg.status_file, **status, onset_wall=now_wall, onset_monotonic=now_mono)
    if cfg.mode == "deadlock":
        _deadlock()
    _wait_for_peer_flag(mem)


if __name__ == "__main__":
    sys.exit(main())
