"""`vllm serve --headless` on a node >= 1 of a multi-node group (vLLM 0.26.0 entrypoints/cli/serve.py:168-219):
no API server, no engine core, no HTTP at all; the node's workers join the group at
`--master-addr:--master-port` and follow the head node's rank 0. The main process blocks in the
executor's worker monitor (inline) until a worker dies, then shuts the executor down and ends 0.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import NoReturn

from supervisor.simulator.gpu.kernel import settle
from supervisor.simulator.options import Scenario
from supervisor.simulator.procutil import import_sglang
from supervisor.simulator.vllm import lines
from supervisor.simulator.vllm.context import VllmContext
from supervisor.simulator.vllm.executor import Fatal, MultiprocExecutor
from supervisor.simulator.vllm.log import VllmLog


def run_headless(ctx: VllmContext) -> NoReturn:
    settle(ctx.settings.gpu_file)
    a = ctx.args
    modules = import_sglang(ctx.settings.import_seconds / 4)
    log = VllmLog()  # run_headless never calls decorate_logs: this process's lines have no prefix
    executor = MultiprocExecutor(ctx, log)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        """serve.py:187-196: the first SIGTERM/SIGINT raises SystemExit out of the monitor."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        executor.shutdown()
        sys.stdout.flush()
        os._exit(0)

    if ctx.settings.scenario is Scenario.IGNORE_SIGTERM:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ctx.onset()
    else:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    log.record(lines.HEADLESS, lines.VLLM_VERSION, f"{a.master_addr}:{a.master_port}")
    try:
        executor.start_headless()
    except Fatal as e:  # a worker ended before READY: the exception leaves `vllm serve` (exit 1)
        log.stderr(e.bootstrap)
        sys.stdout.flush()
        os._exit(1)
    executor.monitor_inline()
    del modules
    sys.stdout.flush()
    os._exit(0)
