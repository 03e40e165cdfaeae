"""A bounded /generate load generator on 127.0.0.1: `python -m bench.load --port P`.

`--concurrency` threads post short generations back to back until `--seconds` pass or SIGTERM;
a refused or failed request waits 0.2 s before the next. Prints one JSON line of counts at exit.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import sys
import threading
import time
from types import FrameType


def client(port: int, tokens: int, stop: threading.Event, counts: dict[str, int], lock: threading.Lock) -> None:
    body = json.dumps({"text": "hello world", "sampling_params": {"max_new_tokens": tokens}})
    conn: http.client.HTTPConnection | None = None
    while not stop.is_set():
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            key = "ok" if resp.status == 200 else "http_error"
        except (OSError, http.client.HTTPException):
            key = "failed"
            if conn is not None:
                conn.close()
            conn = None
        with lock:
            counts[key] = counts.get(key, 0) + 1
        if key != "ok":
            stop.wait(0.2)
    if conn is not None:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--tokens", type=int, default=24)
    a = p.parse_args(argv)
    stop = threading.Event()
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    threads = [
        threading.Thread(target=client, args=(a.port, a.tokens, stop, counts, lock), daemon=True)
        for _ in range(max(1, min(a.concurrency, 16)))
    ]
    for t in threads:
        t.start()
    stop.wait(a.seconds)
    stop.set()
    deadline = time.monotonic() + 5
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))  # a request hung on a stalled server is left behind
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
