"""A local user squatting the daemon's API port (issue 50): a real second process that loops binding
the port (plain, SO_REUSEADDR, SO_REUSEPORT, and the wildcard address), and whenever it wins,
listens and reads what clients send it: a `sglang-supervisor status` that reached it would have sent
the bearer token. Before the handoff carried its listening socket across the re-exec, this won the
gap 5 s after a SIGUSR2.

    python -m bench.squatter --host 127.0.0.1 --port 8700 --out squat.json [--token-file FILE]

It runs until SIGTERM, then writes its figures to `--out` (JSON): tries, binds won, connections and
bytes received, and whether the token was among them. `Squatter` runs it from a test or a bench.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

VARIANTS: tuple[tuple[str | None, int | None], ...] = (
    (None, None),  # the daemon's own address
    (None, socket.SO_REUSEADDR),
    (None, socket.SO_REUSEPORT),
    ("0.0.0.0", socket.SO_REUSEADDR),
)
HOLD_S = 2.0  # once won: how long it listens and reads before trying again
PAUSE_S = 0.001  # between rounds: ~4,000 binds a second, without starving a 2-core test machine


@dataclass
class Figures:
    tries: int = 0
    won: int = 0
    connections: int = 0
    bytes: int = 0
    got_token: bool = False
    won_with: str = ""


def _try_bind(host: str, port: int, opt: int | None) -> socket.socket | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if opt is not None:
            sock.setsockopt(socket.SOL_SOCKET, opt, 1)
        sock.bind((host, port))
        sock.listen(64)
    except OSError:
        sock.close()
        return None
    return sock


def _harvest(sock: socket.socket, token: bytes | None, figures: Figures, until: float) -> None:
    """Accept and read what arrives until `until`; answer like a daemon would, to draw the next request."""
    sock.settimeout(0.05)
    while time.monotonic() < until:
        try:
            conn, _ = sock.accept()
        except OSError:
            continue
        figures.connections += 1
        with conn:
            conn.settimeout(0.5)
            with contextlib.suppress(OSError):
                data = conn.recv(65536)
                figures.bytes += len(data)
                if token and token in data:
                    figures.got_token = True
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")


def squat(host: str, port: int, token: bytes | None, stop: list[bool]) -> Figures:
    figures = Figures()
    while not stop[0]:
        for bind_host, opt in VARIANTS:
            figures.tries += 1
            sock = _try_bind(bind_host or host, port, opt)
            if sock is None:
                continue
            figures.won += 1
            figures.won_with = f"{bind_host or host} {opt}"
            with sock:
                _harvest(sock, token, figures, time.monotonic() + HOLD_S)
        time.sleep(PAUSE_S)
    return figures


class Squatter:
    """`python -m bench.squatter` as a child process; `stop()` ends it and returns its figures."""

    def __init__(self, host: str, port: int, out: Path, token_file: Path | None = None) -> None:
        self.out = out
        argv = [sys.executable, "-m", "bench.squatter", "--host", host, "--port", str(port), "--out", str(out)]
        if token_file is not None:
            argv += ["--token-file", str(token_file)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def stop(self) -> dict[str, Any]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        try:
            got: dict[str, Any] = json.loads(self.out.read_text())
        except (OSError, ValueError):
            return {"error": f"the squatter exited {self.proc.returncode} without figures"}
        return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", type=Path, required=True, help="where its figures go (JSON) when it stops")
    p.add_argument("--token-file", type=Path, default=None, help="the token to look for in what it receives")
    a = p.parse_args(argv)
    token = a.token_file.read_bytes().strip() if a.token_file is not None else None
    stop = [False]

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    figures = squat(a.host, a.port, token, stop)
    a.out.write_text(json.dumps(figures.__dict__) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
