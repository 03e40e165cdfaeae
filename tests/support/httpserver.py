"""A real threaded HTTP server on a random loopback port, for probe tests that need real sockets."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True  # server_close joins every handler thread: nothing outlives the test

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.stop = threading.Event()  # handlers that wait on purpose wait on this

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hung up is what these tests do on purpose


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` in a thread; yields the base URL; stops and joins everything on exit."""
    srv = LoopbackServer(handler)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.stop.set()
        srv.shutdown()
        srv.server_close()
        thread.join(5)


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, no access log on stderr, and a one-call reply."""

    protocol_version = "HTTP/1.1"
    server: LoopbackServer

    def reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass
