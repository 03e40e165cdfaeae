"""uvicorn's side of both engines' HTTP fronts (SGLang's and vLLM's FastAPI apps run under it): a
threading server that binds as uvicorn does, a handler that answers with uvicorn's headers,
`{"detail": ...}` errors and access log line, and the token count both fronts give a prompt."""

from __future__ import annotations

import http
import json
import select
import socket
import socketserver
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def prompt_tokens(text: str) -> int:
    return max(1, int(len(text.split()) * 1.3) + 1)


class UvicornServer(ThreadingHTTPServer):
    """A threading HTTP server that answers as uvicorn does; `access` writes its access log line."""

    daemon_threads = True
    allow_reuse_address = True  # uvicorn sets SO_REUSEADDR too
    request_queue_size = 2048  # uvicorn's backlog
    access: Callable[[str, str, str], None]

    def server_bind(self) -> None:
        # HTTPServer.server_bind would resolve the host name (getfqdn): slow or stuck without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


class UvicornHandler(BaseHTTPRequestHandler):
    """uvicorn's side of every response: headers, `{"detail": ...}` errors, the access log line."""

    protocol_version = "HTTP/1.1"
    timeout = 5  # uvicorn's timeout_keep_alive as SGLang sets it (and vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5)
    server: UvicornServer
    _status: list[int] | None = None

    def version_string(self) -> str:
        return "uvicorn"

    def log_message(self, format: str, *args: object) -> None:
        pass  # the access line is written in log_request, in uvicorn's shape

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        try:
            status = http.HTTPStatus(int(code))
            text = f"{status.value} {status.phrase}"
        except ValueError:
            text = str(code)
        host, port = self.client_address[:2]
        self.server.access(f"{host}:{port}", self.requestline, text)

    def _respond(self, status: int, body: bytes = b"", content_type: str = "application/json") -> None:
        if self._status is not None:
            self._status.append(status)
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        if body or content_type != "application/json":
            self.send_header("content-type", content_type)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: object) -> None:
        self._respond(status, json.dumps(payload).encode())

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        phrase = http.HTTPStatus(code).phrase
        self.close_connection = True
        self._json(code, {"detail": message or phrase})

    def _path(self) -> str:
        return self.path.split("?", 1)[0]

    def _not_found(self) -> None:
        self._json(404, {"detail": "Not Found"})

    def _read_json(self) -> dict[str, object] | None:
        try:
            length = int(self.headers.get("content-length") or 0)
            payload = json.loads(self.rfile.read(length) or b"{}")
        except (ValueError, OSError):
            return None
        return payload if isinstance(payload, dict) else None

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
