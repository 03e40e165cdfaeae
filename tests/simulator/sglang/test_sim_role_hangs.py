"""A hang in each role (issue 51), as SGLang hangs there: what HTTP answers, where py-spy finds each
process, and that nothing is printed for a detector to read."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

if TYPE_CHECKING:
    from conftest import Sim, SimStarter

pytestmark = pytest.mark.integration

READY = "The server is fired up and ready to roll!"
FAST_FAULT = {"SGLANG_SIM_FAULT_AFTER_S": "0.5", "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}
PY_SPY = str(Path(sys.executable).with_name("py-spy"))


def py_spy(pid: int) -> str:
    return subprocess.run([PY_SPY, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30).stdout


def main_thread(dump: str) -> str:
    """The MainThread's stack out of a py-spy dump."""
    block = dump.split('"MainThread"', 1)[1]
    return block.split("\nThread ", 1)[0]


def child(s: Sim, title: str) -> psutil.Process:
    for c in s.children():
        try:
            if c.cmdline()[:1] == [title]:
                return c
        except psutil.Error:
            continue
    raise AssertionError(f"no {title} among {s.children()}")


def ready(s: Sim) -> None:
    """Ready and healthy once, then past the fault's start (SGLANG_SIM_FAULT_AFTER_S after ready)."""
    assert s.wait_log(READY, timeout=60)
    assert s.request("/health", timeout=10)[0] == 200
    time.sleep(1.0)


def began(s: Sim) -> bool:
    return s.onset_path.exists() and s.onset().get("onset_wall") is not None


def test_frontend_hang_blocks_the_event_loop_so_nothing_is_read(sim: SimStarter) -> None:
    s = sim("frontend_hang", tp=2, env=FAST_FAULT)
    ready(s)
    assert s.wait_until(lambda: began(s), 30)
    before = s.stderr()
    for path in ("/health", "/get_model_info", "/metrics"):  # even the front end's own routes
        with pytest.raises(OSError):
            s.request(path, timeout=2.0)
    with pytest.raises(OSError):
        s.generate(4, timeout=2.0)
    assert s.accepts()  # the kernel still takes the connection: nobody reads it
    stack = main_thread(py_spy(s.proc.pid))
    assert "TokenizerManager.wait_for_model_update" in stack and "BaseEventLoop._run_once" in stack, stack
    assert s.stderr() == before  # nothing printed for a detector
    assert s.onset()["scenario"] == "frontend_hang"


def test_detokenizer_hang_holds_every_output_while_the_ranks_idle(sim: SimStarter) -> None:
    s = sim("detokenizer_hang", tp=2, env=FAST_FAULT)
    ready(s)
    # The first output after the fault's start meets the held lock: the health check's own.
    assert s.request("/health", timeout=10)[0] == 503
    assert began(s)
    assert s.request("/get_model_info")[0] == 200  # the front end answers what it knows alone
    with pytest.raises(OSError):
        s.generate(4, timeout=2.0)
    detok = child(s, "sglang::detokenizer")
    stack = main_thread(py_spy(detok.pid))
    assert "Detokenizer.batch_decode" in stack, stack
    for rank in s.schedulers():  # finished: waiting for work in their loops, in no forward
        rank_stack = main_thread(py_spy(rank.pid))
        assert "select" in rank_stack and "_forward" not in rank_stack, rank_stack
    assert s.request("/health", timeout=10)[0] == 503
    assert s.onset()["scenario"] == "detokenizer_hang"


def test_collective_skipped_leaves_the_others_in_all_reduce_and_the_skipper_idle(sim: SimStarter) -> None:
    s = sim("collective_skipped", tp=3, env=FAST_FAULT)
    ready(s)
    assert s.request("/health", timeout=10)[0] == 503  # its forward never completes
    assert began(s)
    time.sleep(0.5)
    ranks = s.schedulers()
    assert [r.cmdline()[0] for r in ranks] == [f"sglang::scheduler_TP{i}" for i in range(3)]
    stacks = [main_thread(py_spy(r.pid)) for r in ranks]
    assert all("all_reduce" in st for st in stacks[:2]), stacks
    assert "all_reduce" not in stacks[2] and "follow" in stacks[2], stacks[2]
    assert "Health check failed." in s.stderr()  # SGLang's own line; the skip itself prints nothing
    assert s.onset()["scenario"] == "collective_skipped"
