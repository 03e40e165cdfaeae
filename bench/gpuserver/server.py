"""The main process, shaped like `python -m sglang.launch_server` on one GPU.

Takes SGLang's command line (`--model-path`, `--host`, `--port`, anything else ignored), spawns the
scheduler, and waits on a pipe for it as SGLang's launcher does: nothing listens on the port until
the scheduler says it is ready. Then (only in `serve` mode, as the scheduler never says so in the
hang modes) it binds the port, serves `/health`, `/metrics` and the model-info routes, and prints
uvicorn's line and SGLang's ready line.

    GPU_SERVER_MODE=deadlock python -m bench.gpuserver.server --model-path m --host 127.0.0.1 --port 30000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.gpuserver.common import ServerConfig, child_argv, log

METRICS = (
    "# HELP sglang:num_running_reqs The number of running requests.\n"
    "# TYPE sglang:num_running_reqs gauge\n"
    'sglang:num_running_reqs{model_name="gpu-bench",tp_rank="0"} 0.0\n'
    "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
    "# TYPE sglang:num_queue_reqs gauge\n"
    'sglang:num_queue_reqs{model_name="gpu-bench",tp_rank="0"} 0.0\n'
    "# HELP sglang:generation_tokens_total Number of generation tokens processed.\n"
    "# TYPE sglang:generation_tokens_total counter\n"
    'sglang:generation_tokens_total{model_name="gpu-bench",tp_rank="0"} 0.0\n'
)


class _Handler(BaseHTTPRequestHandler):
    model_path = ""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            self._send(200, b"", "text/plain")
        elif path == "/metrics":
            self._send(200, METRICS.encode(), "text/plain; version=0.0.4")
        elif path in ("/get_model_info", "/model_info"):
            body = {"model_path": self.model_path, "is_generation": True}
            self._send(200, json.dumps(body).encode(), "application/json")
        elif path == "/v1/models":
            body = {"object": "list", "data": [{"id": self.model_path, "object": "model"}]}
            self._send(200, json.dumps(body).encode(), "application/json")
        else:
            self._send(404, b'{"detail":"Not Found"}', "application/json")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # SGLang logs no access lines by default


def _spawn_scheduler(write_fd: int) -> subprocess.Popen[bytes]:
    argv, executable, extra = child_argv(
        "sglang::scheduler_TP0", "bench.gpuserver.scheduler", ["--fd", str(write_fd), "--main-pid", str(os.getpid())]
    )
    env = {**os.environ, **extra}
    return subprocess.Popen(argv, executable=executable, env=env, pass_fds=(write_fd,))


def wait_ready(read_fd: int) -> bytes:
    """Block until the scheduler reports ready; b"" when it died first. Forever when it hangs."""
    with os.fdopen(read_fd, "rb") as pipe:
        return pipe.readline()


def serve_http(host: str, port: int, model_path: str) -> None:
    _Handler.model_path = model_path
    httpd = ThreadingHTTPServer((host, port), _Handler)
    sys.stderr.write(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)\n")
    sys.stderr.flush()
    log("The server is fired up and ready to roll!")
    httpd.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.gpuserver.server")
    parser.add_argument("--model-path", default="gpu-bench")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    args, _unknown = parser.parse_known_args(argv)
    ServerConfig.from_env(os.environ)  # refuse a bad mode before spawning anything
    log(f"server_args=ServerArgs(model_path='{args.model_path}', tp_size=1, host='{args.host}', port={args.port})")
    read_fd, write_fd = os.pipe()
    scheduler = _spawn_scheduler(write_fd)
    os.close(write_fd)
    if not wait_ready(read_fd):
        code = scheduler.wait()
        log(f"Received sigquit from a child process. It usually means the child failed. exit code {code}")
        return 1
    serve_http(args.host, args.port, args.model_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
