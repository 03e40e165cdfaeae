"""The main process (`python -m sglang.launch_server`): spawn, wait for ready, bind, warm up, serve, stop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from types import FrameType
from typing import NoReturn

from supervisor.simulator.argv import SimArgs, parse_args
from supervisor.simulator.flood import flood
from supervisor.simulator.gpu.kernel import settle
from supervisor.simulator.loglines import LogWriter
from supervisor.simulator.messages import FiredUp
from supervisor.simulator.modelcard import ModelFacts, model_facts
from supervisor.simulator.nodes import layout_error, node_layout
from supervisor.simulator.onset import write_onset
from supervisor.simulator.options import Scenario, SettingsError, SimSettings, load_settings
from supervisor.simulator.procutil import import_sglang, start_heartbeat
from supervisor.simulator.sglang import crashes
from supervisor.simulator.sglang.httpd import Front, SimHTTPServer
from supervisor.simulator.sglang.launch import Children, kill_process_tree, launch
from supervisor.simulator.sglang.serverargs import ENTRYPOINT_WARNING as _ENTRYPOINT_WARNING
from supervisor.simulator.sglang.serverargs import deprecation_warnings, server_args_line
from supervisor.simulator.sglang.startup import RankContext
from supervisor.simulator.sglang.tokenizer import ServerStatus, TokenizerManager
from supervisor.simulator.sglang.workernode import WorkerNode

DRAIN_LOG_EVERY_S = 5.0
WATCHDOG_INTERVAL_S = 1.0  # SGLang's SubprocessWatchdog polls its children every second
CRASH_DIAG_SLEEP_S = 5.0  # "Sleeping 5 seconds before crash diagnostics" (times pace here)


def _exitcode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


class MainProcess:
    def __init__(
        self, args: SimArgs, settings: SimSettings, facts: ModelFacts, log: LogWriter, argv: Sequence[str] = ()
    ) -> None:
        self.argv = list(argv)
        self.args = args
        self.settings = settings
        self.facts = facts
        self.log = log
        self.stop = threading.Event()
        self.exit_status: dict[int, int] = {}
        self.ignore_sigterm = settings.scenario is Scenario.IGNORE_SIGTERM
        self.serving = False  # the running-phase SIGQUIT handler replaces the launch-phase one
        self.children: Children | None = None
        self.crashing = threading.Event()

    def _onset(self, onset: bool = True) -> None:
        s = self.settings
        write_onset(s.onset_file, s.scenario.value, s.requested.value, os.getpid(), self.args.unknown_flags, onset)

    # Signal handlers: SGLang's own (SIGQUIT at start, SIGTERM once serving), and SIGCHLD to reap.
    def _on_sigchld(self, signum: int, frame: FrameType | None) -> None:
        try:
            pid, status = os.waitpid(0, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:  # reaped silently: SGLang 0.5.16 has no SIGCHLD handler; its subprocess-watchdog reports
            self.exit_status[pid] = status

    def _on_sigquit(self, signum: int, frame: FrameType | None) -> None:
        if not self.serving:  # engine.py launch_phase_sigquit_handler
            self.log.error("Received sigquit from a child process. It usually means the child failed.")
            kill_process_tree(include_parent=True, log=self.log)
            return
        # tokenizer_manager.py running_phase_sigquit_handler (asyncio passes no arguments), then
        # dump_requests_before_crash's diagnostics: off the signal handler, as SGLang's event loop.
        if self.crashing.is_set():
            return
        self.crashing.set()
        self.log.error("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        threading.Thread(target=self._crash_diagnostics, name="crash-dump", daemon=True).start()

    def _crash_diagnostics(self) -> None:
        self.log.info("Sleeping 5 seconds before crash diagnostics to let GPU activity settle.")
        time.sleep(CRASH_DIAG_SLEEP_S * self.settings.pace)
        children = self.children
        alive = children is not None and any(
            children.scheduler_alive(rank) for rank in range(len(children.schedulers))
        )
        if alive:
            wait = self.settings.coredump_wait_seconds
            self.log.info(f"Waiting {wait:.1f} seconds for CUDA coredumps before exiting.")
            time.sleep(wait)
        else:
            self.log.error("No live scheduler processes found; skipping py-spy and CUDA coredump.")
        kill_process_tree(include_parent=True, log=self.log)

    def _subprocess_watchdog(self, children: Children) -> None:
        """SGLang 0.5.16's `subprocess-watchdog` thread: a child that died non-zero means SIGQUIT."""
        procs = [*children.schedulers, children.detokenizer]
        names = [f"scheduler_{i}" for i in range(len(children.schedulers))] + ["detokenizer"]
        while not self.stop.wait(WATCHDOG_INTERVAL_S):
            for proc, name in zip(procs, names, strict=True):
                status = self.exit_status.get(proc.pid or -1)
                if status is None or status == 0:
                    continue
                code = _exitcode(status)
                self.log.error(
                    f"Subprocess {name} (pid={proc.pid}) crashed with exit code {code}. "
                    "Triggering SIGQUIT for cleanup..."
                )
                os.kill(os.getpid(), signal.SIGQUIT)
                return

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if not self.stop.is_set():
            self.log.warning("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        self.stop.set()

    def run(self) -> NoReturn:
        if self.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self._onset()
        elif self.settings.scenario is Scenario.OK or (
            self.settings.scenario is Scenario.LOW_ACCEPT and not self.args.speculative
        ):
            self._onset(onset=False)
        signal.signal(signal.SIGCHLD, self._on_sigchld)
        signal.signal(signal.SIGQUIT, self._on_sigquit)
        # `python -m sglang.launch_server`: 0.5.16 warns first (launch_server.py, under __main__)
        self.log.raw(_ENTRYPOINT_WARNING)
        modules = import_sglang(self.settings.import_seconds / 4)
        for warning in deprecation_warnings(self.argv):
            self.log.raw(warning + "\n")
        if self.args.speculative and self.args.max_running_requests is None:
            self.log.info(  # arg_groups/speculative_hook.py, while the arguments resolve
                "Max running requests is reset to 48 for speculative decoding. You can override this by "
                "explicitly setting --max-running-requests."
            )
        layout = node_layout(self.args)
        if (problem := layout_error(layout)) is not None:  # check_server_args, before anything starts
            self.log.raw(crashes.check_args_traceback(problem))
            os._exit(1)
        self.log.info(server_args_line(self.args, self.facts))
        start_heartbeat("tokenizer-manager-watchdog")
        contexts = [
            RankContext(rank, self.args, self.settings, self.facts, os.getpid()) for rank in layout.local_ranks
        ]
        children = launch(contexts, self.ignore_sigterm, self.settings.import_seconds, layout.multinode)
        children.exit_status = self.exit_status
        self.children = children
        self._wait_for_schedulers(children)
        del modules
        threading.Thread(
            target=self._subprocess_watchdog, args=(children,), name="subprocess-watchdog", daemon=True
        ).start()
        manager = TokenizerManager(self.log, children.to_scheduler, children.from_detokenizer)
        manager.start()
        server = self._bind(Front(self.args, self.settings, self.facts, self.log, manager, time.time()))
        if not self.ignore_sigterm:
            signal.signal(signal.SIGTERM, self._on_sigterm)
            signal.signal(signal.SIGINT, self._on_sigterm)
        # As in SGLang, warm-up runs beside the server, so a SIGTERM during it is handled too.
        threading.Thread(target=self._warm_up_then_serve, args=(manager,), name="warmup", daemon=True).start()
        asyncio.run(self._event_loop(manager))
        self._shut_down(manager, children, server)

    async def _event_loop(self, manager: TokenizerManager) -> None:
        """The main thread's event loop, as SGLang's uvicorn runs it: requests are read and outputs
        handed on by its turns (TokenizerManager.through_loop); it ends once SIGTERM asked for a stop."""
        manager.loop = asyncio.get_running_loop()
        while not self.stop.is_set():
            await asyncio.sleep(0.5)

    def _wait_for_schedulers(self, children: Children) -> None:
        """Like SGLang: wait for each rank in turn, with no deadline; a dead rank ends the launch."""
        for rank, reader in enumerate(children.ready):
            try:
                data = reader.recv()
            except EOFError:
                self._scheduler_died(children, rank)
            if not isinstance(data, dict) or data.get("status") != "ready":
                self.log.error("Initialization failed. Please see the error messages above.")
                kill_process_tree(include_parent=False, log=self.log)
                os._exit(1)

    def _scheduler_died(self, children: Children, rank: int) -> NoReturn:
        self.log.error(f"Rank {rank} scheduler is dead. Please check if there are relevant logs.")
        proc = children.schedulers[rank]
        proc.join(timeout=5)
        status = self.exit_status.get(proc.pid or -1)
        self.log.error(f"Exit code: {_exitcode(status) if status is not None else proc.exitcode}")
        self.log.raw(crashes.launch_eof_traceback())
        kill_process_tree(include_parent=False, log=self.log)
        os._exit(1)

    def _bind(self, front: Front) -> SimHTTPServer:
        """uvicorn's start-up: its lines, then the bind; nothing listened before this point."""
        self.log.uvicorn(f"Started server process [{os.getpid()}]")
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        host, port = self.args.host, self.args.port
        try:
            server = SimHTTPServer(front)
        except OSError as e:
            self.log.uvicorn(f"[Errno {e.errno}] error while attempting to bind on address ('{host}', {port}): "
                             f"{(e.strerror or str(e)).lower()}", "ERROR")
            self.log.uvicorn("Waiting for application shutdown.")
            self.log.uvicorn("Application shutdown complete.")
            kill_process_tree(include_parent=False, log=self.log)
            os._exit(1)
        if self.settings.scenario is Scenario.ESCAPE_GROUP:
            self._spawn_escapee(server.socket.fileno())
        threading.Thread(target=server.serve_forever, args=(0.1,), name="uvicorn", daemon=True).start()
        shown = f"[{host}]" if ":" in host else host
        self.log.uvicorn(f"Uvicorn running on http://{shown}:{port} (Press CTRL+C to quit)")
        return server

    def _spawn_escapee(self, fd: int) -> None:
        argv = [sys.executable, "-m", "supervisor.simulator.escape", str(fd), str(os.getpid())]
        argv += self.args.unknown_flags
        helper = subprocess.Popen(argv, pass_fds=(fd,), stdin=subprocess.DEVNULL)
        helper.wait()  # it forks and its first half exits at once

    def _warm_up(self) -> None:
        """SGLang's warm-up: a GET /model_info, then one short POST /generate, to itself."""
        if self.args.skip_server_warmup:
            return
        host = self.args.host
        connect = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
        connect = f"[{connect}]" if ":" in connect and not connect.startswith("[") else connect
        base = f"http://{connect}:{self.args.port}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        payload = {"text": "The capital city of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
        time.sleep(min(1.0, self.settings.pace))
        try:
            opener.open(base + "/model_info", timeout=5).read()
            request = urllib.request.Request(
                base + "/generate", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
            )
            opener.open(request, timeout=600).read()
        except OSError as e:
            self.log.error(f"Initialization failed. warmup error: {e!r}")
            kill_process_tree(include_parent=True, log=self.log)

    def _warm_up_then_serve(self, manager: TokenizerManager) -> None:
        self._warm_up()
        if self.stop.is_set():
            return
        manager.status = ServerStatus.UP
        self.serving = True
        self.log.info("The server is fired up and ready to roll!")
        manager.send(FiredUp())
        self._after_ready(manager)

    def _block_event_loop(self, manager: TokenizerManager) -> None:
        """FRONTEND_HANG: a blocking call lands on the event loop; from then on it never turns."""
        loop = manager.loop
        if loop is None or self.stop.is_set():
            return
        self._onset()
        loop.call_soon_threadsafe(manager.wait_for_model_update)

    def _after_ready(self, manager: TokenizerManager) -> None:
        scenario = self.settings.scenario
        if scenario is Scenario.LOW_ACCEPT and self.args.speculative:
            self._onset()
        elif scenario is Scenario.FRONTEND_HANG:
            timer = threading.Timer(self.settings.fault_after_s, self._block_event_loop, args=(manager,))
            timer.daemon = True
            timer.start()
        elif scenario is Scenario.LOG_FLOOD:
            self._onset()
            threading.Thread(target=flood, args=(self.log, self.settings.flood_mb), name="flood", daemon=True).start()

    def _shut_down(self, manager: TokenizerManager, children: Children, server: SimHTTPServer) -> NoReturn:
        """Drain in-flight requests (no deadline, as SGLang), then kill the children and exit 0."""
        manager.status = ServerStatus.SHUTTING_DOWN
        last_log = float("-inf")
        while (remaining := manager.in_flight()) > 0 and children.scheduler_alive(0):
            if time.monotonic() - last_log >= DRAIN_LOG_EVERY_S:
                self.log.info(f"Gracefully exiting... Remaining number of requests {remaining}.")
                last_log = time.monotonic()
            time.sleep(0.1)
        kill_process_tree(include_parent=False, log=self.log)
        server.server_close()
        os._exit(0)


def main(argv: list[str]) -> int:
    try:
        settings = load_settings(os.environ, argv)
    except SettingsError as e:
        print(f"simulator: {e}", file=sys.stderr)
        return 2
    args = parse_args(argv)
    settle(settings.gpu_file)  # the last tree's never-ending kernels died with it
    log = LogWriter("")
    if args.node_rank >= 1:  # a worker node: no tokenizer, no HTTP API
        if (problem := layout_error(node_layout(args))) is not None:
            log.raw(crashes.check_args_traceback(problem))
            return 1
        WorkerNode(args, settings, model_facts(args), log, argv).run()
    try:
        MainProcess(args, settings, model_facts(args), log, argv).run()
    except KeyboardInterrupt:
        kill_process_tree(include_parent=False, log=log)
        return 130
    return 0
