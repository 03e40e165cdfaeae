"""A tiny process tree that deadlocks like a hung SGLang scheduler, for diagnostics tests.

`python deadlock_prog.py deadlock N`: the parent starts N child processes; in each child two
threads take two locks in opposite order and deadlock; a heartbeat thread keeps sleeping. The
parent waits forever. `busy` spins a Python loop instead (`front`: see idle_child). Prints
"ready <pids>" once all children have deadlocked, so a test knows when to capture.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading
import time


def heartbeat() -> None:
    while True:
        time.sleep(0.2)


def take_a_then_b(a: threading.Lock, b: threading.Lock, both_hold: threading.Barrier) -> None:
    with a:
        both_hold.wait()
        b.acquire()  # deadlocks here: the other thread holds b and waits for a


def take_b_then_a(a: threading.Lock, b: threading.Lock, both_hold: threading.Barrier) -> None:
    with b:
        both_hold.wait()
        a.acquire()  # deadlocks here: the other thread holds a and waits for b


def deadlock_child(ready: mp.synchronize.Event) -> None:
    import faulthandler  # here, not at the top: the tests name this file's line numbers
    import os

    if os.environ.get("DEADLOCK_PROG_NATIVE_THREAD") == "1":
        # A thread with no Python thread state (faulthandler's watchdog is a C thread), as NCCL's and
        # CUDA's are in a real rank: py-spy does not list it, gdb does.
        faulthandler.dump_traceback_later(3600)
    a, b = threading.Lock(), threading.Lock()
    both_hold = threading.Barrier(2)
    threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
    t1 = threading.Thread(target=take_a_then_b, args=(a, b, both_hold), name="weights-sync")
    t2 = threading.Thread(target=take_b_then_a, args=(a, b, both_hold), name="graph-pool")
    t1.start()
    t2.start()
    both_hold_seen = False
    while not both_hold_seen:  # both threads past the barrier: each holds one lock
        both_hold_seen = a.locked() and b.locked()
        time.sleep(0.01)
    time.sleep(0.05)
    ready.set()
    t1.join()


def spin_forever() -> None:
    n = 0
    while True:
        n += 1


def busy_child(ready: mp.synchronize.Event) -> None:
    ready.set()
    spin_forever()


def idle_child(ready: mp.synchronize.Event) -> None:
    """`front`, SGLang's shape under load: children wait idly, a thread of the parent spins (HTTP)."""
    threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
    ready.set()
    threading.Event().wait()


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "deadlock"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    target = {"deadlock": deadlock_child, "front": idle_child}.get(mode, busy_child)
    if mode == "front":
        threading.Thread(target=spin_forever, name="uvicorn", daemon=True).start()
    ctx = mp.get_context("fork")
    events = [ctx.Event() for _ in range(count)]
    children = [ctx.Process(target=target, args=(ev,), name=f"child{i}") for i, ev in enumerate(events)]
    for c in children:
        c.start()
    for ev in events:
        ev.wait(30)
    print("ready", " ".join(str(c.pid) for c in children), flush=True)
    for c in children:
        c.join()


if __name__ == "__main__":
    main()
