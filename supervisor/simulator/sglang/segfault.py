"""A rank dying of SIGSEGV inside a collective, as a scheduler with a bad custom all-reduce does."""

from __future__ import annotations

from typing import NoReturn

from supervisor.simulator.loglines import LogWriter
from supervisor.simulator.onset import write_onset
from supervisor.simulator.procutil import segfault
from supervisor.simulator.sglang.startup import RankContext

_SEGV_DUMP = """Fatal Python error: Segmentation fault

Thread 0x{other:016x} (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait
  File "/usr/lib/python3.12/threading.py", line 655 in wait
  File "/usr/local/lib/python3.12/dist-packages/tqdm/_monitor.py", line 60 in run
  File "/usr/lib/python3.12/threading.py", line 1075 in _bootstrap_inner
  File "/usr/lib/python3.12/threading.py", line 1032 in _bootstrap

Current thread 0x{current:016x} (most recent call first):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/distributed/device_communicators/custom_all_reduce.py", \
line 338 in all_reduce
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/distributed/parallel_state.py", \
line 521 in _all_reduce_in_place
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 1002 in event_loop_normal
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 2930 in run_scheduler_process

Extension modules: numpy._core._multiarray_umath, torch._C, torch._C._dynamo.autograd_compiler, \
psutil._psutil_linux, zmq.backend.cython._zmq, setproctitle._setproctitle (total: 211)
"""


def victim_rank(tp_size: int) -> int:
    return 1 if tp_size > 1 else 0


def die_of_segfault(ctx: RankContext, log: LogWriter) -> NoReturn:
    """A real SIGSEGV, preceded by the dump faulthandler would print from inside SGLang's all-reduce."""
    s = ctx.settings
    write_onset(s.onset_file, s.scenario.value, s.requested.value, ctx.main_pid, ctx.args.unknown_flags)
    log.raw(_SEGV_DUMP.format(other=0x7F3B2EFFD640 + ctx.rank, current=0x7F3C61E8E740 + ctx.rank))
    segfault()
