"""`launch_dummy_health_check_server` (SGLang 0.5.16 `utils/common.py`): what a node >= 1 serves.

A FastAPI app under uvicorn on the node's own `--host`/`--port`, in a daemon thread, at log level
warning (no access log). `/health`, `/health_generate` and `/ping` answer 200 with an empty body
whatever the schedulers do: it says nothing about the ranks. With `--enable-metrics` it mounts
`/metrics` over the node's multiprocess directory, where no rank of a node >= 1 writes (only TP0
reports metrics by default), so it is empty.
"""

from __future__ import annotations

import json
import socket
import socketserver
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
_OK_ROUTES = ("/health", "/health_generate", "/ping")


class DummyHealthServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # uvicorn's

    def __init__(self, host: str, port: int, enable_metrics: bool) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.enable_metrics = enable_metrics
        super().__init__((host, port), _Handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # no getfqdn: slow or stuck without DNS
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 5
    server: DummyHealthServer

    def version_string(self) -> str:
        return "uvicorn"

    def log_message(self, format: str, *args: object) -> None:
        pass  # uvicorn at log level warning: no access lines

    def _send(self, status: int, body: bytes = b"", content_type: str | None = None) -> None:
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        if content_type:
            self.send_header("content-type", content_type)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _detail(self, status: int, text: str) -> None:
        self._send(status, json.dumps({"detail": text}).encode(), "application/json")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self.close_connection = True
        self._detail(code, message or "Bad Request")

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in _OK_ROUTES:
            self._send(200)
        elif self.server.enable_metrics and path.startswith("/metrics"):
            self._send(200, b"", PROMETHEUS_TEXT)
        else:
            self._detail(404, "Not Found")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        length = self.headers.get("content-length", "0")
        if length.isdigit() and int(length) <= 1 << 20:
            self.rfile.read(int(length))
        else:
            self.close_connection = True
        if path in _OK_ROUTES:
            self._detail(405, "Method Not Allowed")
        else:
            self._detail(404, "Not Found")
