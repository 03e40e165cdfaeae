"""A stand-in for one torch rank's Flight Recorder, for tests where torch is not installed: a real
process that does what ProcessGroupNCCL's heartbeat monitor does with
`TORCH_NCCL_DEBUG_INFO_PIPE_FILE` and `TORCH_NCCL_DUMP_ON_TIMEOUT=1` (torch/csrc/distributed/c10d):
it makes the FIFO `<pipe stem><rank>.pipe`, reads it every 0.1 s, and when something was written
dumps its ring to `<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>` as a pickle of the documented layout
(`version`, `pg_config`, `entries` with `process_group`, `collective_seq_id`, `profiling_name`,
`state`), while it keeps running. The entries are SYNTHETIC (given on the command line).

`python fr_rank.py RANK LAST_SEQ STATE [hostile]`: collectives #1..LAST_SEQ of `nccl:all_reduce`
in process group "0", the last in STATE, the others completed. `hostile`: the dump is a pickle
that would run code (os.system) if it were unpickled with the default loader.
"""

from __future__ import annotations

import os
import pickle
import sys
import time


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {os.environ.get('FR_EVIL_MARK', '/tmp/fr-evil-ran')}",))


def dump(rank: int, last: int, state: str, hostile: bool) -> bytes:
    if hostile:
        return pickle.dumps({"version": "2.10", "entries": [_Evil()]})
    entries = [
        {
            "record_id": i,
            "pg_id": 0,
            "process_group": ("0", "default_pg"),
            "collective_seq_id": i,
            "p2p_seq_id": 0,
            "op_id": i,
            "profiling_name": "nccl:all_reduce",
            "time_created_ns": time.time_ns(),
            "input_sizes": [[1024]],
            "output_sizes": [[1024]],
            "state": state if i == last else "completed",
            "is_p2p": False,
            "frames": [{"name": "all_reduce", "filename": "distributed_c10d.py", "line": 2501}],
        }
        for i in range(1, last + 1)
    ]
    return pickle.dumps({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                         "pg_status": {}, "entries": entries})


def main() -> None:
    rank, last, state = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    hostile = len(sys.argv) > 4 and sys.argv[4] == "hostile"
    pipe = f"{os.environ['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}{rank}.pipe"
    out = f"{os.environ['TORCH_NCCL_DEBUG_INFO_TEMP_FILE']}{rank}"
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    print("ready", flush=True)
    while True:
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            data = b""
        if data:
            tmp = out + ".tmp"
            with open(tmp, "wb") as f:
                f.write(dump(rank, last, state, hostile))
            os.rename(tmp, out)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
