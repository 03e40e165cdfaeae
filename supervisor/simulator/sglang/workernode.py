"""The main process of a node with `--node-rank` >= 1, as SGLang 0.5.16's `_launch_subprocesses` runs it.

No tokenizer manager, no detokenizer, no HTTP API: it starts this node's schedulers (global TP
ranks), waits for them to be ready (which needs the whole group at the rendezvous), starts the dummy
health server, then joins its schedulers one by one. When they have all ended it falls through into
the HTTP server's start-up with no tokenizer manager, which fails in the app's lifespan: exit 3.
No subprocess watchdog and no SIGTERM handler run here (SIGTERM kills it, PDEATHSIG the ranks); a
scheduler's SIGQUIT meets the launch-phase handler, which kills the tree and itself.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import NoReturn

from supervisor.simulator.argv import SimArgs
from supervisor.simulator.loglines import LogWriter
from supervisor.simulator.modelcard import ModelFacts
from supervisor.simulator.nodes import node_layout
from supervisor.simulator.onset import write_onset
from supervisor.simulator.options import Scenario, SimSettings
from supervisor.simulator.procutil import import_sglang, start_heartbeat
from supervisor.simulator.sglang import crashes
from supervisor.simulator.sglang.dummyhealth import DummyHealthServer
from supervisor.simulator.sglang.launch import kill_process_tree, launch_ranks
from supervisor.simulator.sglang.serverargs import ENTRYPOINT_WARNING, deprecation_warnings, server_args_line
from supervisor.simulator.sglang.startup import RankContext

UVICORN_STARTUP_FAILURE = 3
READY_POLL_S = 5.0  # _wait_for_scheduler_ready's poll


class WorkerNode:
    def __init__(
        self, args: SimArgs, settings: SimSettings, facts: ModelFacts, log: LogWriter, argv: list[str]
    ) -> None:
        self.args = args
        self.settings = settings
        self.facts = facts
        self.log = log
        self.argv = argv

    def _on_sigquit(self, signum: int, frame: FrameType | None) -> None:
        self.log.error("Received sigquit from a child process. It usually means the child failed.")
        kill_process_tree(include_parent=True, log=self.log)

    def run(self) -> NoReturn:
        s = self.settings
        if s.scenario is Scenario.IGNORE_SIGTERM:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            write_onset(s.onset_file, s.scenario.value, s.requested.value, os.getpid(), self.args.unknown_flags)
        elif s.scenario is Scenario.OK:
            write_onset(s.onset_file, "ok", s.requested.value, os.getpid(), self.args.unknown_flags, onset=False)
        signal.signal(signal.SIGQUIT, self._on_sigquit)
        self.log.raw(ENTRYPOINT_WARNING)
        modules = import_sglang(s.import_seconds / 4)
        for warning in deprecation_warnings(self.argv):
            self.log.raw(warning + "\n")
        if self.args.speculative and self.args.max_running_requests is None:
            self.log.info(
                "Max running requests is reset to 48 for speculative decoding. You can override this by "
                "explicitly setting --max-running-requests."
            )
        self.log.info(server_args_line(self.args, self.facts))
        start_heartbeat("main-heartbeat")
        layout = node_layout(self.args)
        contexts = [RankContext(rank, self.args, s, self.facts, os.getpid()) for rank in layout.local_ranks]
        schedulers, readers = launch_ranks(contexts)
        self._wait_for_ready(schedulers, readers)
        del modules
        self._dummy_health_server()
        for proc in schedulers:  # wait_for_completion
            proc.join()
            self.log.error(f"Scheduler or DataParallelController {proc.pid} terminated with {proc.exitcode}")
        self._http_server_without_tokenizer()

    def _wait_for_ready(self, schedulers: list[BaseProcess], readers: list[Connection]) -> None:
        """0.5.16's `_wait_for_scheduler_ready`: each rank in turn, polling every 5 s, and between polls
        every rank checked for an early death."""
        for rank, reader in enumerate(readers):
            while True:
                if reader.poll(READY_POLL_S):
                    try:
                        data = reader.recv()
                    except EOFError:
                        self._died(rank, schedulers)
                    if not isinstance(data, dict) or data.get("status") != "ready":
                        self._failed(RuntimeError("Initialization failed. Please see the error messages above."))
                    break
                for other, proc in enumerate(schedulers):
                    if not proc.is_alive():
                        self._died(other, schedulers)

    def _died(self, rank: int, schedulers: list[BaseProcess]) -> NoReturn:
        proc = schedulers[rank]
        proc.join(timeout=10)
        self._failed(
            RuntimeError(
                f"Rank {rank} scheduler died during initialization (exit code: {proc.exitcode}). "
                "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
                "Run `dmesg -T | grep -i oom` to check."
            ),
            schedulers,
        )

    def _failed(self, error: RuntimeError, schedulers: Sequence[BaseProcess] = ()) -> NoReturn:
        """The exception leaves `launch_server`: Python prints it, then multiprocessing's exit hook
        joins the other (non-daemon) schedulers, which may take until they end, then exit 1."""
        self.log.raw(crashes.worker_ready_traceback(str(error)))
        for proc in schedulers:
            proc.join()
        os._exit(1)

    def _dummy_health_server(self) -> None:
        host, port = self.args.host, self.args.port
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            server = DummyHealthServer(host, port, self.args.enable_metrics)
        except OSError as e:
            self.log.info(f"Dummy health check server started in background thread at {shown}")
            self.log.error(  # uvicorn's bind error in that thread, then its finally
                f"[Errno {e.errno}] error while attempting to bind on address ('{host}', {port}): "
                f"{(e.strerror or str(e)).lower()}"
            )
            self.log.info(f"Dummy health check server stopped at {shown}")
            return
        self.log.info(f"Dummy health check server started in background thread at {shown}")
        threading.Thread(target=server.serve_forever, args=(0.1,), name="health-check-server", daemon=True).start()

    def _http_server_without_tokenizer(self) -> NoReturn:
        self.log.uvicorn(f"Started server process [{os.getpid()}]")
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn(crashes.worker_lifespan_traceback(), "ERROR")
        self.log.uvicorn("Application startup failed. Exiting.", "ERROR")
        os._exit(UVICORN_STARTUP_FAILURE)
