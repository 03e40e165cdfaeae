"""`vllm serve` with one API server (vLLM 0.26.0): the main process is the API server.

Its life as entrypoints/cli/serve.py:48-144 and entrypoints/openai/api_server.py:742-795 run it:
decorate the logs `(APIServer pid=N)` (:749, no process title: only API servers spawned for data
parallelism get `VLLM::APIServer_N`, v1/utils.py:509), `setup_server` (the logo, the non-default
arguments, the port *bound but not listening*, :599-651), the engine config (model, scheduler, the
VllmConfig's own lines), the engine core started and waited for with no deadline
(v1/engine/utils.py:1225-1360), then the app: `Supported tasks`, `Starting vLLM server on`, the route
list, and uvicorn, which starts listening once `Application startup complete.` is printed.

After ready: `/health` is a flag (client.py); the watchdog (launcher.py:155-180, every 5 s) shuts the
server down once the engine client has errored, and the process ends 0. SIGTERM (launcher.py:95-150
and uvicorn's own handler) stops the engine client (the engine core SIGTERMed, then SIGKILLed at
once: `shutdown_timeout` is 0) and the HTTP server; the process ends 0. SIGTERM before ready is
`KeyboardInterrupt("terminated")` (api_server.py:751-756): the engine core is stopped by its manager's
finalizer and the interpreter ends by SIGINT, as Python does for an uncaught KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import NoReturn

from supervisor.simulator.flood import flood
from supervisor.simulator.gpu.kernel import settle
from supervisor.simulator.options import Scenario
from supervisor.simulator.procutil import import_sglang, start_heartbeat
from supervisor.simulator.vllm import crashes, lines
from supervisor.simulator.vllm.client import EngineClient, stop_engine
from supervisor.simulator.vllm.context import VllmContext
from supervisor.simulator.vllm.engine import process_name, run_engine_core
from supervisor.simulator.vllm.http import VllmHTTPServer, route_lines
from supervisor.simulator.vllm.log import VllmLog
from supervisor.simulator.vllm.messages import EngineReady, Serving

WATCHDOG_S = 5.0  # launcher.py:162 VLLM_WATCHDOG_TIME_S
FINALIZER_TIMEOUT_S = 5.0  # v1/utils.py:598-601: shutdown() without a timeout keeps 5 s of grace


def listen_address(host: str | None, port: int) -> str:
    """api_server.py:643-650."""
    shown = f"[{host}]" if host and ":" in host else host or "0.0.0.0"
    return f"http://{shown}:{port}"


class ApiServer:
    def __init__(self, ctx: VllmContext, log: VllmLog) -> None:
        self.ctx = ctx
        self.log = log
        self.stop = threading.Event()
        self.signalled = False
        self.engine: BaseProcess | None = None
        self.ignore_sigterm = ctx.settings.scenario is Scenario.IGNORE_SIGTERM

    # --- start-up ------------------------------------------------------------------------------------------------
    def run(self) -> NoReturn:
        s, a = self.ctx.settings, self.ctx.args
        if self.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.ctx.onset()
        elif s.scenario is Scenario.OK or (s.scenario is Scenario.LOW_ACCEPT and a.speculative is None):
            self.ctx.onset(onset=False)
        modules = import_sglang(s.import_seconds / 4)  # `vllm serve` imports vLLM before it prints anything
        self.log.decorate("APIServer")
        if not self.ignore_sigterm:
            signal.signal(signal.SIGTERM, self._interrupt_init)
        sock = self._setup_server()
        self._config_lines()
        engine, conn = self._launch_engine()
        self._wait_for_engine(engine, conn)
        client = EngineClient(self.ctx, self.log, conn, engine)
        client.start()
        server = self._serve(sock, client)
        del modules
        while not self.stop.wait(0.5):
            pass
        self._shut_down(server, client)

    def _setup_server(self) -> socket.socket:
        a = self.ctx.args
        self.log.record(lines.LOGO, lines.VLLM_VERSION, a.model)
        self.log.record(lines.NON_DEFAULT_ARGS, dict(a.non_default))
        host = a.host or ""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, a.port))  # bound now, listening only when uvicorn serves (vllm#8204)
        except OSError as e:
            self.log.stderr(crashes.bind_failed(e.errno or 0, e.strerror or str(e)))
            sys.stdout.flush()
            os._exit(1)
        return sock

    def _config_lines(self) -> None:
        """create_engine_config's lines (config/model.py:623,1788; config/scheduler.py:252; config/vllm.py)."""
        a, f = self.ctx.args, self.ctx.facts
        self.log.record(lines.RESOLVED_ARCHITECTURE, f.architecture)
        self.log.record(lines.MAX_MODEL_LEN, f.max_model_len)
        self.log.record(lines.CHUNKED_PREFILL, f.max_num_batched_tokens)
        async_scheduling = True
        if a.speculative is not None and a.speculative.method == "ngram":
            self.log.record(lines.ASYNC_SCHEDULING_UNSUPPORTED, "ngram")
            async_scheduling = False
        self.log.record(lines.ASYNC_SCHEDULING, "enabled" if async_scheduling else "disabled")
        if a.enforce_eager:
            self.log.record(lines.ENFORCE_EAGER)
            self.log.record(lines.CUDAGRAPH_EAGER)

    def _launch_engine(self) -> tuple[BaseProcess, Connection]:
        mp = multiprocessing.get_context("spawn")
        ours, theirs = mp.Pipe(duplex=True)
        proc = mp.Process(target=run_engine_core, args=(self.ctx, theirs), name=process_name(self.ctx))
        proc.start()
        theirs.close()
        self.engine = proc
        return proc, ours

    def _wait_for_engine(self, proc: BaseProcess, conn: Connection) -> None:
        """wait_for_engine_startup: no deadline; the engine core's exit is `Engine core initialization failed`."""
        while True:
            with contextlib.suppress(OSError):
                if conn.poll(0.2):
                    try:
                        if isinstance(conn.recv(), EngineReady):
                            return
                    except EOFError:
                        pass
            if not proc.is_alive():
                proc.join(1)
                failed = {proc.name: proc.exitcode if proc.exitcode is not None else 1}
                self.log.stderr(crashes.engine_init_failed(failed))
                sys.stdout.flush()
                os._exit(1)

    def _interrupt_init(self, signum: int, frame: FrameType | None) -> None:
        """api_server.py:751-756 `_interrupt_init`: KeyboardInterrupt("terminated"); unwinding runs the engine
        manager's finalizer (terminate, 5 s, SIGKILL), then Python prints the traceback and dies of SIGINT."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.engine is not None:
            stop_engine(self.engine, FINALIZER_TIMEOUT_S, self.log)
        self.log.stderr(crashes.interrupted())
        sys.stdout.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)

    # --- serving -------------------------------------------------------------------------------------------------
    def _serve(self, sock: socket.socket, client: EngineClient) -> VllmHTTPServer:
        a = self.ctx.args
        self.log.record(lines.SUPPORTED_TASKS, ("generate",))
        self.log.record(lines.STARTING_SERVER, listen_address(a.host, a.port))
        self.log.record(lines.ROUTES)
        for path, methods in route_lines():
            self.log.record(lines.ROUTE, path, methods)
        access = self.log.access if not a.disable_uvicorn_access_log else _no_access
        server = VllmHTTPServer(sock, client, access, self.stop.set)
        self.log.uvicorn(f"Started server process [{os.getpid()}]")  # uvicorn/server.py:101-103
        self.log.uvicorn("Waiting for application startup.")  # uvicorn/lifespan/on.py:48
        self.log.uvicorn("Application startup complete.")  # uvicorn/lifespan/on.py:62
        server.server_activate()  # loop.create_server(sock=...): listen(backlog)
        if self.ctx.settings.scenario is Scenario.ESCAPE_GROUP:
            self._spawn_escapee(sock.fileno())
        threading.Thread(target=server.serve_forever, args=(0.1,), name="uvicorn", daemon=True).start()
        if not self.ignore_sigterm:
            signal.signal(signal.SIGTERM, self._on_sigterm)
            signal.signal(signal.SIGINT, self._on_sigterm)
        threading.Thread(target=self._watchdog, args=(client,), name="watchdog_loop", daemon=True).start()
        client.send(Serving())
        self._after_ready()
        return server

    def _after_ready(self) -> None:
        s, a = self.ctx.settings, self.ctx.args
        if s.scenario is Scenario.LOW_ACCEPT and a.speculative is not None:
            self.ctx.onset()
        elif s.scenario is Scenario.LOG_FLOOD:
            self.ctx.onset()
            threading.Thread(target=flood, args=(self.log, s.flood_mb, "vllm"), name="flood", daemon=True).start()

    def _spawn_escapee(self, fd: int) -> None:
        argv = [sys.executable, "-m", "supervisor.simulator.escape", str(fd), str(os.getpid())]
        argv += self.ctx.args.unknown_flags
        subprocess.Popen(argv, pass_fds=(fd,), stdin=subprocess.DEVNULL).wait()

    def _watchdog(self, client: EngineClient) -> None:
        """launcher.py:155-180: every 5 s, an errored engine client ends the server (unless
        VLLM_KEEP_ALIVE_ON_ENGINE_DEATH, envs.py:1052)."""
        keep_alive = os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0").strip() not in ("", "0")
        while not self.stop.is_set():
            time.sleep(WATCHDOG_S)
            if client.errored and not keep_alive:
                self.stop.set()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True
        self.stop.set()

    def _shut_down(self, server: VllmHTTPServer, client: EngineClient) -> NoReturn:
        """Signalled: launcher.py's handle_shutdown (:95-131) then uvicorn's shutdown; errored: uvicorn's
        shutdown, then the engine client's (api_server.py:200-201) with `shutdown_timeout` 0."""
        if self.signalled:
            client.stopping = True
            self.log.record(lines.API_SHUTDOWN_TRIGGERED)
            self.log.record(lines.API_STOPPING_CLIENT, "abort", 0)
            client.shutdown(0)
            self.log.record(lines.API_CLIENT_STOPPED)
            self.log.record(lines.API_SIGNALLING_HTTP)
            self.log.record(lines.API_SHUTTING_DOWN_HTTP)
        self.log.uvicorn("Shutting down")  # uvicorn/server.py:282
        server.socket.close()
        self.log.uvicorn("Waiting for application shutdown.")  # uvicorn/lifespan/on.py:67
        self.log.uvicorn("Application shutdown complete.")
        if not self.signalled:
            self.log.uvicorn(f"Finished server process [{os.getpid()}]")  # uvicorn/server.py:111-113
            client.shutdown(0)
        sys.stdout.flush()
        os._exit(0)


def _no_access(client: str, request_line: str, status: str) -> None:
    pass  # --disable-uvicorn-access-log


def run_api_server(ctx: VllmContext) -> NoReturn:
    settle(ctx.settings.gpu_file)  # the last tree's never-ending kernels died with it
    log = VllmLog()
    start_heartbeat("MPClientEngineMonitor-heartbeat")
    ApiServer(ctx, log).run()


def main(argv: list[str]) -> int:
    """`python -m supervisor.simulator --engine vllm <vllm serve's arguments>`."""
    from supervisor.simulator.options import SettingsError, load_settings
    from supervisor.simulator.vllm.argv import fold_underscores, parse_vllm_args
    from supervisor.simulator.vllm.facts import vllm_facts
    from supervisor.simulator.vllm.headless import run_headless

    try:
        settings = load_settings(os.environ, fold_underscores(argv))
    except SettingsError as e:
        print(f"simulator: {e}", file=sys.stderr)
        return 2
    args = parse_vllm_args(argv)
    ctx = VllmContext(args, settings, vllm_facts(args), os.getpid())
    if args.headless or args.node_rank > 0:
        run_headless(ctx)
    run_api_server(ctx)
