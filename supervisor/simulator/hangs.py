"""Real hangs, not sleeps: what py-spy and gdb find in them is what they would find in SGLang.

- `deadlock_forever`: lock-order inversion between two threads on two `threading.Lock`s; both sit
  in `acquire` (futex wait), the calling thread waits in `join`. 0 % CPU.
- `spin_forever`: one thread polls a flag nobody will set, at 100 % of a core, in Python; the
  calling thread waits in `join`. What a collective spinning on a dead peer looks like from the host.
- `wait_for_collective`: the calling thread blocks on a lock that is never released, as a rank
  does in an all-reduce whose peer has died.
- `init_attention_backends`: nvidia-resiliency-ext's LOCK_GIL fault where REAL_SGLANG.md put it on
  the H200: libc `sleep` called through `ctypes.PyDLL`, which keeps the GIL, so no other thread of
  the process runs Python; the thread sleeps in `clock_nanosleep`. 0 % CPU.
- `stuck_in_kernel`: a thread the kernel will not wake (D state), as a read from a hung network
  mount leaves one: glibc's `posix_spawn` keeps the calling thread in `kernel_clone` (an
  uninterruptible vfork wait, state D) until its child execs, and the child first opens a FIFO that
  no one will ever write. The GIL stays held (CPython does not release it around posix_spawn).
- `gpu_sleep`: its GPU_SLEEP fault: a kernel that never ends, and the host thread spins in
  `Event.synchronize` on it at one core (the simulated GPU reads busy with almost no SM work).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from supervisor.simulator.gpu.kernel import SpinningKernel
from supervisor.simulator.mirror.sglang.srt.model_executor.model_runner import ModelRunner
from supervisor.simulator.mirror.torch.cuda.streams import Event

_weights_lock = threading.Lock()
_kv_pool_lock = threading.Lock()
_peer_flag = [0]  # set by a peer that never comes


def _sync_weights_to_graph_pool(both_held: threading.Barrier) -> None:
    with _weights_lock:
        both_held.wait()
        with _kv_pool_lock:  # held by _allocate_kv_pool, which waits for _weights_lock
            pass


def _allocate_kv_pool(both_held: threading.Barrier) -> None:
    with _kv_pool_lock:
        both_held.wait()
        with _weights_lock:  # held by _sync_weights_to_graph_pool, which waits for _kv_pool_lock
            pass


def deadlock_forever() -> NoReturn:
    both_held = threading.Barrier(2)
    workers = [
        threading.Thread(target=_sync_weights_to_graph_pool, args=(both_held,), name="weight-sync"),
        threading.Thread(target=_allocate_kv_pool, args=(both_held,), name="kv-pool-init"),
    ]
    for worker in workers:
        worker.daemon = True
        worker.start()
    for worker in workers:
        worker.join()
    raise AssertionError("a deadlock ended")


def _wait_for_peer_flag() -> None:
    while not _peer_flag[0]:
        pass


def spin_forever() -> NoReturn:
    spinner = threading.Thread(target=_wait_for_peer_flag, name="custom-all-reduce", daemon=True)
    spinner.start()
    spinner.join()
    raise AssertionError("a spin ended")


def wait_for_collective() -> NoReturn:
    never_released = threading.Lock()
    never_released.acquire()
    never_released.acquire()  # the peer that would release it is gone
    raise AssertionError("a collective finished without its peer")


def _heartbeat() -> None:
    while True:
        time.sleep(0.5)  # a helper that would keep running Python if the GIL were free


def init_attention_backends() -> NoReturn:
    hold_gil_forever(ModelRunner().init_attention_backends)


def hold_gil_forever(sleep_with_gil: Callable[[], NoReturn]) -> NoReturn:
    """A helper thread parked in its sleep, then `sleep_with_gil` (a native sleep that keeps the GIL)."""
    threading.Thread(target=_heartbeat, name="tqdm_monitor", daemon=True).start()
    time.sleep(0.1)  # the helper is parked in its sleep before the GIL is taken for good
    sleep_with_gil()


def gpu_sleep(gpu_file: str | None) -> NoReturn:
    done = Event()
    done.record(SpinningKernel(gpu_file))
    done.synchronize()
    raise AssertionError("a never-ending kernel finished")


def stuck_in_kernel() -> NoReturn:
    folder = tempfile.mkdtemp(prefix="sim-dstate-")
    path = os.path.join(folder, "never-written")
    os.mkfifo(path)
    held = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # keeps the FIFO alive once its name is gone
    os.unlink(path)
    os.rmdir(folder)  # nothing is left on disk when the tree is killed
    # The child's open of the FIFO for reading waits for a writer that never comes; its signals are
    # blocked until the exec it never reaches, so only SIGKILL ends it (and, with it, this D state).
    never = [(os.POSIX_SPAWN_OPEN, 3, f"/proc/self/fd/{held}", os.O_RDONLY, 0)]
    os.posix_spawn("/bin/true", ["/bin/true"], {}, file_actions=never)
    raise AssertionError("a thread left D state")
