"""Flood: API clients that try to starve the daemon of file descriptors (issue 16).

Two clients each open `--connections` connections to the daemon's API (loopback only) and trickle
one header line every 2 s on each, never finishing a request (slowloris); a closed connection is
reopened at the next tick. Before the fix this ran the daemon out of descriptors: it judged a
healthy server `exited`, stopped it and crashed on EMFILE. Target: the server keeps serving, zero
incidents, the daemon alive, `/status` answering within a second once the flood ends; also with the
daemon under `ulimit -n 1024`.

    .venv/bin/python -m bench.flood                 # both cases, 10,200 connections per client, 20 s
    .venv/bin/python -m bench.flood --connections 2000 --seconds 10 --no-write
"""

from __future__ import annotations

import argparse
import errno
import multiprocessing as mp
import os
import resource
import selectors
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.common import PY, ROOT, Daemon, header, met, publish, save_result, sim_settings, workdir
from bench.report import table

TRICKLE_S = 2.0
STATUS_TARGET_S = 1.0


def _flood_client(port: int, connections: int, seconds: float, out: Any) -> None:
    """One client: keep up to `connections` slow-header connections open for `seconds`."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sel = selectors.DefaultSelector()
    socks: dict[int, socket.socket] = {}
    opened = closed_by_peer = failed = 0
    end = time.monotonic() + seconds

    def open_one() -> bool:
        nonlocal opened, failed
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex(("127.0.0.1", port))
        if err not in (0, errno.EINPROGRESS):
            s.close()
            failed += 1
            return False
        socks[s.fileno()] = s
        sel.register(s, selectors.EVENT_READ)
        opened += 1
        return True

    def drop(s: socket.socket) -> None:
        sel.unregister(s)
        socks.pop(s.fileno(), None)
        s.close()

    try:
        first = True
        while time.monotonic() < end:
            while len(socks) < connections:
                try:
                    if not open_one():
                        break
                except OSError:
                    failed += 1
                    break
            for s in list(socks.values()):
                try:
                    s.send(b"GET /status HTTP/1.1\r\n" if first else b"X-Slow: 1\r\n")
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    closed_by_peer += 1
                    drop(s)
            first = False
            tick_end = min(end, time.monotonic() + TRICKLE_S)
            while (left := tick_end - time.monotonic()) > 0:
                for key, _ in sel.select(left):
                    s = socks.get(key.fd)  # type: ignore[assignment]
                    if s is None:
                        continue
                    try:
                        data = s.recv(4096)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        closed_by_peer += 1
                        drop(s)
    finally:
        for s in list(socks.values()):
            s.close()
        out.put({"opened": opened, "closed_by_peer": closed_by_peer, "connect_failed": failed})


@dataclass
class Case:
    name: str
    nofile: int | None  # the daemon's `ulimit -n`, or None for the machine's default


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def _server_serving(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def run_case(case: Case, connections: int, seconds: float) -> dict[str, Any]:
    wd = workdir(f"flood-{case.name}")
    s = sim_settings(wd, "ok", tp=1, env={"SGLANG_SIM_HEALTH_LATENCY_S": "0.05"})
    d = Daemon(s, wd)
    if case.nofile is not None:
        # As `ulimit -n N` in a shell: soft and hard both N, so the daemon cannot raise it.
        log = open(wd / "daemon.log", "wb")  # noqa: SIM115 - closed below, the child keeps its copy
        cmd = f"ulimit -n {case.nofile} && exec {PY} -m supervisor run --config {d.config} --log-json"
        d.proc = subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
    else:
        d.start()
    try:
        d.wait(lambda x: x.get("state") == "ready", 120, "ready before the flood")
        q: mp.Queue[dict[str, int]] = mp.Queue()
        clients = [mp.Process(target=_flood_client, args=(s.api.port, connections, seconds, q)) for _ in range(2)]
        for c in clients:
            c.start()
        peak_fds, serving_checks, serving_ok = 0, 0, 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            peak_fds = max(peak_fds, _fds(d.pid))
            serving_checks += 1
            serving_ok += _server_serving(s.server.port)
            time.sleep(1.0)
        results = [q.get(timeout=60) for _ in clients]
        for c in clients:
            c.join(30)
        t0 = time.monotonic()
        status = None
        while time.monotonic() - t0 < 30 and status is None:
            status = d.status()
        status_after_s = time.monotonic() - t0
        alive = d.proc is not None and d.proc.poll() is None
        incidents = [e for e in d.events() if e.get("event") == "incident"]
        return {
            "case": case.name,
            "nofile": case.nofile or resource.getrlimit(resource.RLIMIT_NOFILE)[1],
            "connections": 2 * connections,
            "seconds": seconds,
            "opened": sum(r["opened"] for r in results),
            "closed_by_daemon": sum(r["closed_by_peer"] for r in results),
            "peak_daemon_fds": peak_fds,
            "server_serving": f"{serving_ok}/{serving_checks}",
            "incidents": len(incidents),
            "daemon_alive": alive,
            "state_after": (status or {}).get("state"),
            "loop_errors": (status or {}).get("loop_errors"),
            "status_after_s": round(status_after_s, 3),
            "ok": bool(
                alive
                and not incidents
                and serving_ok == serving_checks
                and status is not None
                and status.get("state") == "ready"
                and status_after_s <= STATUS_TARGET_S
            ),
        }
    finally:
        d.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=10_200, help="connections per client (2 clients)")
    p.add_argument("--seconds", type=float, default=20.0, help="how long each flood lasts")
    p.add_argument("--no-write", action="store_true", help="print the table only, leave docs/BENCHMARKS.md")
    a = p.parse_args(argv)
    rows = [run_case(c, a.connections, a.seconds) for c in (Case("default", None), Case("ulimit-1024", 1024))]
    save_result("flood", rows)
    cols = (
        "case",
        "nofile",
        "connections",
        "opened",
        "closed_by_daemon",
        "peak_daemon_fds",
        "server_serving",
        "incidents",
        "daemon_alive",
        "state_after",
        "status_after_s",
    )
    body = header(
        "Flood: slow-header API clients against the daemon's descriptors",
        "flood",
        f"Two clients, {a.connections} connections each on loopback, one header line every {TRICKLE_S:g} s "
        f"for {a.seconds:g} s, reopening what the daemon closes; the server (simulator, tp 1) is probed "
        "directly every second. Target (issue 16): the server serving throughout, no incident, the daemon "
        f"alive and `/status` answering within {STATUS_TARGET_S:g} s after the flood: "
        f"{met(all(r['ok'] for r in rows))}.",
    ).replace("bench.run_all --only flood", "bench.flood")
    body += "\n" + table(cols, [[r[c] for c in cols] for r in rows]) + "\n"
    if a.no_write:
        print(body)
    else:
        publish("flood", body)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
