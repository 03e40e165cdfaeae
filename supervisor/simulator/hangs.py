"""Real hangs, not sleeps: what py-spy and gdb find in them is what they would find in SGLang.

- `deadlock_forever`: lock-order inversion between two threads on two `threading.Lock`s; both sit
  in `acquire` (futex wait), the calling thread waits in `join`. 0 % CPU.
- `spin_forever`: one thread polls a flag nobody will set, at 100 % of a core, in Python; the
  calling thread waits in `join`. What a collective spinning on a dead peer looks like from the host.
- `wait_for_collective`: the calling thread blocks on a lock that is never released, as a rank
  does in an all-reduce whose peer has died.
"""

from __future__ import annotations

import threading
from typing import NoReturn

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
