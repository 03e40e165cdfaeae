"""A small NCCL RAS server for tests: a real TCP listener speaking the client protocol of NCCL's
src/ras/client.cc (CLIENT PROTOCOL, TIMEOUT, SET FORMAT json, STATUS -> JSON to EOF), or
misbehaving on request (garbage, a hang after connect, a hang mid-report)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from typing import Literal

Mode = Literal["ok", "garbage", "hang", "hang_report", "bad_json", "no_json"]


def comm(
    pids: list[int], *, missing: list[tuple[int, int]] | None = None, counts: list[int] | None = None
) -> dict[str, object]:
    """One communicator as NCCL 2.28 writes it: ranks 0..n-1 on `pids`, `missing` (rank, pid)."""
    counts = counts or [5] * len(pids)
    ops = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
    ranks = [
        {
            "rank": i,
            "host": "127.0.0.1",
            "pid": pid,
            "cuda_dev": i,
            "nvml_dev": i,
            "status": {"init_state": 0, "async_error": 0, "finalize_called": False, "destroy_flag": False,
                       "abort_flag": False},
            "collective_counts": {op: (counts[i] if op == "AllReduce" else 0) for op in ops},
        }
        for i, pid in enumerate(pids)
    ]
    miss = [
        {"rank": r, "host": "127.0.0.1", "pid": p, "cuda_dev": r, "nvml_dev": r,
         "status": {"unresponsive": True, "considered_dead": False}}
        for r, p in missing or []
    ]
    return {"hash": "0x1234abcd", "secondary_hash": "0x1:0x2", "size": len(pids) + len(miss),
            "ranks_count": len(pids), "missing_ranks_count": len(miss), "ranks": ranks, "missing_ranks": miss}


def report(comms: list[dict[str, object]]) -> str:
    return json.dumps({
        "nccl_version": "2.28.9", "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
        "timestamp": "2026-12-01 15:00:00", "communicators_count": len(comms), "communicators": comms,
        "ras": {"collection_time_sec": 0.002, "timeouts_count": 0},
    }, indent=2) + "\n"


class FakeRas:
    def __init__(self, body: Callable[[], str], mode: Mode = "ok") -> None:
        self.body, self.mode = body, mode
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.requests: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        with conn:
            if self.mode == "hang":
                self._stop.wait(30)
                return
            f = conn.makefile("rb")
            for raw in f:
                line = raw.decode().strip()
                self.requests.append(line)
                if self.mode == "garbage":
                    conn.sendall(b"\x00\xffHTTP/1.1 400 Bad Request\r\n\r\n")
                    return
                if line.startswith("CLIENT PROTOCOL"):
                    conn.sendall(b"SERVER PROTOCOL 2\n")
                elif line.startswith("TIMEOUT"):
                    conn.sendall(b"OK\n")
                elif line == "SET FORMAT json":
                    conn.sendall(b"ERROR: Unknown command\n" if self.mode == "no_json" else b"OK\n")
                elif line.endswith("STATUS"):
                    body = self.body()
                    if self.mode == "bad_json":
                        body = body[: len(body) // 2]
                    if self.mode == "hang_report":
                        conn.sendall(body[:40].encode())
                        self._stop.wait(30)
                        return
                    conn.sendall(body.encode())
                    return
                else:
                    conn.sendall(b"ERROR: Unknown command\n")

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
