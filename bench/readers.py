"""The cost of each new evidence reader (issue 24), on this machine: NCCL's RAS query (a report, a
service that is absent, one that hangs) and pystack on a SIGSTOPped Python process (Python frames,
and with native frames), beside py-spy on the same process running and stopped.

The RAS service is tests/support/fake_ras.py: a real TCP server speaking NCCL's client protocol
with an 8-rank communicator; the process read is a real Python interpreter with 8 threads waiting
on locks, SIGSTOPped.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from bench.common import PY, header, median, publish, save_result
from bench.report import table
from supervisor.diagnostics import find_pystack, parse_pystack, pystack_argv, query_ras
from tests.support.fake_ras import FakeRas, comm, report  # the tests' RAS server (run from the repository root)

PROG = """
import threading, time
lock = threading.Lock(); lock.acquire()
for i in range(8):
    threading.Thread(target=lock.acquire, name=f"rank-{i}", daemon=True).start()
time.sleep(3600)
"""


def _time(fn: object, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        tic = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - tic)
    return out


def _run(argv: list[str], timeout: float) -> tuple[int | None, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, ""
    return p.returncode, p.stdout


def measure(reps: int) -> list[list[object]]:
    rows: list[list[object]] = []
    ras = FakeRas(lambda: report([comm(list(range(1000, 1008)), missing=[(7, 1007)])]))
    hung = FakeRas(lambda: "", "hang")
    try:
        ok = _time(lambda: query_ras(ras.address, 8.0), reps)
        rows.append(["RAS STATUS, 8-rank communicator, one rank missing", reps, median(ok), max(ok), "ok"])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = f"127.0.0.1:{s.getsockname()[1]}"
            absent = _time(lambda: query_ras(closed, 8.0), reps)
        rows.append(["RAS, nothing listening (absent)", reps, median(absent), max(absent), "absent"])
        h = _time(lambda: query_ras(hung.address, 2.0), 2)
        rows.append(["RAS, a service that never answers (bound 2 s)", 2, median(h), max(h), "timeout"])
    finally:
        ras.close()
        hung.close()
    proc = subprocess.Popen([PY, "-c", PROG])
    try:
        time.sleep(1.0)
        spy = str(Path(PY).parent / "py-spy")
        codes: list[int | None] = []
        running = _time(lambda: codes.append(_run([spy, "dump", "--pid", str(proc.pid)], 20)[0]), reps)
        seen = "ok" if set(codes) == {0} else f"exit {sorted(set(map(str, codes)))}"
        rows.append(["py-spy dump, running process (9 threads)", reps, median(running), max(running), seen])
        os.kill(proc.pid, signal.SIGSTOP)
        exe = find_pystack()
        if exe is None:
            rows.append(["pystack", 0, float("nan"), float("nan"), "not installed"])
        else:
            threads = len(parse_pystack(_run(list(pystack_argv(exe, proc.pid, native=False)), 20)[1]))
            py = _time(lambda: _run(list(pystack_argv(exe, proc.pid, native=False)), 20), reps)
            rows.append([f"pystack remote, SIGSTOPped ({threads} threads read)", reps, median(py), max(py), "ok"])
            nat = _time(lambda: _run(list(pystack_argv(exe, proc.pid, native=True)), 20), reps)
            rows.append(["pystack remote --native, SIGSTOPped", reps, median(nat), max(nat), "ok"])
        code: list[int | None] = []
        stopped = _time(lambda: code.append(_run([spy, "dump", "--pid", str(proc.pid)], 5.0)[0]), 1)
        why = "timed out" if code[0] is None else f"exit {code[0]}"
        rows.append(["py-spy dump, SIGSTOPped (limit 5 s)", 1, median(stopped), max(stopped), why])
    finally:
        proc.kill()
        proc.wait()
    return rows


def render(rows: list[list[object]]) -> str:
    intro = (
        "What each reader of issue 24 costs a capture. The RAS query runs in a thread beside the tools "
        "(its time is `durations.ras_s` in a bundle); pystack replaces py-spy for a process in state T "
        "(py-spy cannot read one and costs its whole timeout)."
    )
    tbl = table(
        ["reader", "n", "median s", "max s", "outcome"],
        [[r[0], r[1], f"{float(str(r[2])):.4f}", f"{float(str(r[3])):.4f}", r[4]] for r in rows],
    )
    return header("Evidence readers: RAS query and pystack", "readers", intro) + "\n" + tbl + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args(argv)
    rows = measure(a.reps)
    save_result("readers", rows)
    publish("readers", render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
