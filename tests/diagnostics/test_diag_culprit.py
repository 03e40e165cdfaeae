"""The culprit, pure (issue 35): per rank the thread that stopped progress, in the shapes the capture
produces (py-spy threads with their status, /proc samples), and the rank named first across ranks."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest

from probes.types import ThreadInfo
from supervisor.diagnostics import Evidence, Frame, ProcEvidence, StackThread
from supervisor.diagnostics.classify import classify
from supervisor.diagnostics.culprit import (
    Culprit,
    culprits,
    died_culprit,
    held_from,
    lost_pids,
    never_joined,
    rank_culprit,
)
from supervisor.diagnostics.tools import parse_py_spy
from supervisor.status.causes import HangClass

PID = 100


def py(tid: int, name: str, *frames: tuple[str, str, int], status: str = "idle") -> StackThread:
    return StackThread(tid, name, tuple(Frame(f, file, line) for f, file, line in frames), status)


def sample(*threads: tuple[int, str, str, str]) -> tuple[ThreadInfo, ...]:
    return tuple(ThreadInfo(*t) for t in threads)


def proc(samples: tuple[ThreadInfo, ...], *threads: StackThread, pid: int = PID, rank: int = 0) -> ProcEvidence:
    return ProcEvidence(pid, "scheduler", rank, f"sglang::scheduler_TP{rank}", (samples, samples), python=threads)


TQDM = py(PID + 1, "tqdm_monitor", ("TMonitor.run", "tqdm/_monitor.py", 60), ("wait", "threading.py", 331))
GLOO = py(PID + 2, "pt_gloo_runloop", ("run", "gloo/loop.py", 12))
HELPERS = ((PID + 1, "python", "S", "futex_do_wait"), (PID + 2, "pt_gloo_runloop", "S", "futex_do_wait"))


def test_the_gil_holder_asleep_in_native_code_is_the_culprit_and_helpers_fold() -> None:
    main = py(
        PID,
        "MainThread",
        ("init_attention_backends", "sitecustomize.py", 27),
        ("ModelRunner.__init__", "sglang/srt/model_executor/model_runner.py", 300),
        status="idle+gil",
    )
    c = rank_culprit(proc(sample((PID, "python", "S", "hrtimer_nanosleep"), *HELPERS), main, TQDM, GLOO), 31.0)
    assert c is not None
    assert c.thread == "MainThread" and c.gil and c.held_s == 31.0
    assert c.frames[0] == "init_attention_backends (sitecustomize.py:27)"
    assert "holds the GIL" in c.evidence[0]
    assert c.helpers == 2 and dict(c.helper_kinds) == {"tqdm": 1, "gloo": 1}
    line = c.line()
    assert line.startswith(f"Culprit: scheduler TP0 pid {PID} thread 'MainThread' tid {PID} ")
    # the innermost frame, then the server's own frame that called into it (the H200 run's lesson)
    assert "at init_attention_backends (sitecustomize.py:27) in ModelRunner.__init__" in line
    assert line.endswith(", holding the GIL, no progress for 31 s")


def test_a_main_thread_that_only_joins_points_at_the_thread_it_waits_for() -> None:
    main = py(PID, "MainThread", ("join", "threading.py", 1112), ("deadlock_forever", "hangs.py", 50))
    worker = py(PID + 3, "weight-sync", ("_sync_weights_to_graph_pool", "hangs.py", 31))
    s = sample((PID, "python", "S", "futex_do_wait"), (PID + 3, "python", "S", "futex_do_wait"), *HELPERS)
    c = rank_culprit(proc(s, main, worker, TQDM, GLOO), None)
    assert c is not None and c.thread == "weight-sync"
    assert c.frames[0] == "_sync_weights_to_graph_pool (hangs.py:31)"
    assert "the main thread only joins it" in c.evidence[0]


def test_a_wait_in_stdlib_names_its_caller_and_the_call() -> None:
    main = py(
        PID,
        "MainThread",
        ("_PollLikeSelector.select", "selectors.py", 415),
        ("ServingLoop._receive", "decode_loop.py", 127),
        ("run", "decode_loop.py", 110),
    )
    c = rank_culprit(proc(sample((PID, "python", "S", "do_sys_poll")), main), 5.0)
    assert c is not None
    assert c.frames[:2] == ("ServingLoop._receive (decode_loop.py:127)", "run (decode_loop.py:110)")
    assert c.doing == "waits in select", c


def test_a_thread_in_d_state_ranks_before_an_idle_rank() -> None:
    idle = proc(sample((PID, "python", "S", "futex_do_wait")), py(PID, "MainThread", ("loop", "s.py", 1)), rank=0)
    d_main = py(PID + 10, "MainThread", ("stuck_in_kernel", "hangs.py", 112))
    stuck = proc(sample((PID + 10, "python", "D", "kernel_clone")), d_main, pid=PID + 10, rank=1)
    named = culprits(Evidence((idle, stuck)), 4.0)
    assert [c.rank for c in named] == [1, 0]
    assert named[0].doing == "is in D state in kernel_clone"


def test_a_stack_read_through_a_vfork_childs_shared_memory_stays_with_its_owner() -> None:
    """py-spy on a vfork child reads its parent's threads: the child has no thread of that tid."""
    shadow = py(PID, "MainThread", ("stuck_in_kernel", "hangs.py", 112), status="active")
    child = proc(sample((PID + 5, "python", "S", "wait_for_partner")), shadow, pid=PID + 5)
    c = rank_culprit(child, None)
    assert c is not None and c.tid == PID + 5 and c.frames == () and c.doing.startswith("waits")


def test_a_stopped_rank_comes_first_then_a_spinner() -> None:
    spin = py(PID, "custom-all-reduce", ("_wait_for_peer_flag", "hangs.py", 64), status="active+gil")
    spinner = proc(sample((PID, "python", "R", "0")), spin, rank=0)
    frozen = ProcEvidence(
        PID + 20,
        "scheduler",
        1,
        samples=(sample((PID + 20, "python", "T", "do_signal_stop")),) * 2,
        python=(py(PID + 20, "MainThread", ("_decode", "decode_loop.py", 244)),),
        stopped=True,
    )
    named = culprits(Evidence((spinner, frozen)), 9.0)
    assert [c.rank for c in named] == [1, 0]
    assert named[0].doing.startswith("is stopped") and named[0].frames[0] == "_decode (decode_loop.py:244)"
    assert named[1].doing == "runs" and named[1].gil


def test_the_rank_that_never_joined_comes_before_the_waiting_ones() -> None:
    wait = py(PID, "MainThread", ("all_reduce", "parallel_state.py", 521))
    a = proc(sample((PID, "python", "S", "futex_do_wait")), wait, rank=0)
    late = py(PID + 30, "MainThread", ("load_weights", "loader.py", 80))
    b = proc(sample((PID + 30, "python", "S", "futex_do_wait")), late, pid=PID + 30, rank=1)
    named = culprits(Evidence((a, b)), None, missing_pids=[PID + 30])
    assert named[0].rank == 1 and "never joined the collective" in named[0].evidence[0]


FAULT = """\
Fatal Python error: Segmentation fault

Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f0000000002 (most recent call first):
  File "/v/site-packages/sglang/srt/distributed/device_communicators/custom_all_reduce.py", line 338 in all_reduce
  File "/v/site-packages/sglang/srt/managers/scheduler.py", line 1002 in event_loop_normal

[2026-12-02 10:00:00] Subprocess scheduler_1 (pid=4242) crashed with exit code -11.
"""


def test_a_rank_dead_of_a_segfault_is_named_from_its_last_words() -> None:
    c = died_culprit(FAULT.splitlines(), [4242], 3.0)
    assert c is not None and c.rank == 1 and c.pid == 4242 and c.thread == "0x00007f0000000002"
    assert c.frames[0] == "all_reduce (sglang/srt/distributed/device_communicators/custom_all_reduce.py:338)"
    assert c.doing == "died of a segmentation fault" and "exit with code -11" in c.evidence[1]
    assert c.line().startswith("Culprit: scheduler TP1 pid 4242 (exited) thread '0x00007f0000000002' died of")


@pytest.mark.parametrize(
    ("tail", "lost", "pid"),
    [
        ([], [4242], None),  # no last words: nothing to name a dead rank by
        (["no fatal error here"], [4242], None),
        (FAULT.splitlines(), [], 4242),  # the verdict lost no pid: SGLang's own "crashed" line names it
    ],
)
def test_a_dead_rank_needs_its_last_words(tail: list[str], lost: list[int], pid: int | None) -> None:
    got = died_culprit(tail, lost, None)
    assert (got.pid if got is not None else None) == pid


def test_verdict_figures_read_safely() -> None:
    assert held_from({"figures": {"since_progress_s": 12.345}}) == 12.3
    assert held_from({"figures": {"running_reqs": 2.0, "since_tokens_s": 6.04}}) == 6.0  # a serving stall's
    assert held_from({"figures": {"health_failures": 2.0}}) is None
    assert held_from({"figures": {"since_progress_s": True}}) is None
    assert held_from({"figures": "garbage"}) is None
    assert lost_pids({"figures": {"lost_pid": 42}}) == [42] and lost_pids({}) == []


H200_GIL = json.loads((Path(__file__).parent / "fixtures" / "h200-lock-gil-culprit.json").read_text())


def test_the_h200_lock_gil_culprit_line_names_sglangs_frame() -> None:
    """The real frames of the H200 run (LOCK_GIL injected into SGLang 0.5.16): its first line then
    named only the injected `_hold_the_gil`; it must name SGLang's frame that called into the hang."""
    kept = H200_GIL["culprit"]
    c = Culprit(
        kept["rank"],
        kept["pid"],
        kept["process"],
        kept["thread"],
        kept["tid"],
        kept["doing"],
        tuple(kept["frames"]),
        kept["held_s"],
        tuple(kept["evidence"]),
        kept["gil"],
        kept["helpers"],
        tuple(kept["helper_kinds"].items()),
    )
    line = c.line()
    assert line.startswith("Culprit: scheduler TP0 pid 799 thread 'MainThread' tid 799 sleeps in clock_nanosleep ")
    assert " in TpModelWorker.init_attention_backends (tp_worker.py:390)" in line, line
    assert "init_attention_backends" not in H200_GIL["first_line_then"]  # the line this test guards against


def test_the_h200_lock_gil_stack_read_again_gives_the_same_culprit() -> None:
    """The H200 main thread's stack laid out as `py-spy dump --native` prints it (innermost first; the
    GIL mark from pystack's look), read the way the capture reads it: the same frames and a first line
    naming the main thread and SGLang's frame. The results file kept the culprit's six frames only, so
    the native frames between `clock_nanosleep` and the Python site (libffi, _ctypes) and the wchan
    are left out; neither decides the culprit."""
    kept = H200_GIL["culprit"]
    native = next(f for f in kept["frames"] if ".py:" not in f)
    python = [f for f in kept["frames"] if f != native]
    dump = "\n".join(['Thread 799 (idle): "MainThread"', f"    {native}", *(f"    {f}" for f in python)])
    main = replace(parse_py_spy(dump)[0], status="idle+gil")
    s = sample((799, "python", "S", "hrtimer_nanosleep"))
    c = rank_culprit(proc(s, main, pid=799), kept["held_s"])
    assert c is not None and c.thread == "MainThread" and c.gil
    assert c.frames == tuple(kept["frames"]), c.frames
    assert c.doing == kept["doing"] and c.evidence[0] == kept["evidence"][0]
    line = c.line()
    assert line.startswith("Culprit: scheduler TP0 pid 799 thread 'MainThread' tid 799 sleeps in clock_nanosleep at ")
    assert " in TpModelWorker.init_attention_backends (tp_worker.py:390), holding the GIL" in line, line


def _two_ranks_one_never_joined() -> Evidence:
    reduce = py(PID, "MainThread", ("all_reduce", "torch/distributed/distributed_c10d.py", 2806))
    tp0 = proc(sample((PID, "python", "S", "futex_do_wait")), reduce)
    late = py(PID + 30, "MainThread", ("load_weights", "loader.py", 80))
    tp1 = proc(sample((PID + 30, "python", "S", "futex_do_wait")), late, pid=PID + 30, rank=1)
    return Evidence((tp0, tp1))


# One row per hang class (supervisor.status.causes.HangClass), in the shapes the simulator and real
# SGLang give: the class the rules decide, and the first line naming the culprit's thread and frame.
# The collective row is the frames' own rule (a rank waits in torch.distributed, another never came);
# through the daemon the simulator reaches it only with NCCL RAS's word or a multi-node group.
CLASS_TABLE = [
    (
        "idle_deadlock",
        lambda: Evidence(
            (
                proc(
                    sample((PID, "python", "S", "futex_do_wait"), (PID + 3, "python", "S", "futex_do_wait")),
                    py(PID, "MainThread", ("join", "threading.py", 1112), ("deadlock_forever", "hangs.py", 50)),
                    py(
                        PID + 3,
                        "weight-sync",
                        ("_sync_weights_to_graph_pool", "hangs.py", 40),
                        ("Thread.run", "threading.py", 982),
                    ),
                ),
            )
        ),
        "scheduler TP0 pid 100 thread 'weight-sync' tid 103 waits in futex_do_wait at _sync_weights_to_graph_pool",
    ),
    (
        "busy_spin",
        lambda: Evidence(
            (
                proc(
                    sample((PID, "python", "S", "futex_do_wait"), (PID + 4, "python", "R", "0")),
                    py(PID, "MainThread", ("join", "threading.py", 1112), ("spin_forever", "hangs.py", 70)),
                    py(PID + 4, "custom-all-reduce", ("_wait_for_peer_flag", "hangs.py", 66), status="active+gil"),
                ),
            )
        ),
        "scheduler TP0 pid 100 thread 'custom-all-reduce' tid 104 runs at _wait_for_peer_flag (hangs.py:66)",
    ),
    ("collective", _two_ranks_one_never_joined, "scheduler TP1 pid 130 thread 'MainThread' tid 130 waits"),
    (
        "cuda_graph_capture",
        lambda: Evidence(
            (
                proc(
                    sample((PID, "python", "R", "0")),
                    py(
                        PID,
                        "MainThread",
                        ("Event.synchronize", "torch/cuda/streams.py", 254),
                        ("CudaGraphRunner.capture", "sglang/srt/model_executor/cuda_graph_runner.py", 400),
                        status="active+gil",
                    ),
                ),
            )
        ),
        "thread 'MainThread' tid 100 runs at Event.synchronize (torch/cuda/streams.py:254) in CudaGraphRunner.capture",
    ),
    (
        "io_wait",
        lambda: Evidence(
            (
                proc(
                    sample((PID, "python", "D", "kernel_clone")),
                    py(PID, "MainThread", ("stuck_in_kernel", "hangs.py", 112), ("_allocate_kv", "startup.py", 180)),
                ),
            )
        ),
        "thread 'MainThread' tid 100 is in D state in kernel_clone at stuck_in_kernel (hangs.py:112)"
        " in _allocate_kv (startup.py:180)",
    ),
    (
        "unknown",
        lambda: Evidence(
            (
                proc(
                    sample((PID, "python", "S", "do_sys_poll")),
                    py(
                        PID,
                        "MainThread",
                        ("_PollLikeSelector.select", "selectors.py", 415),
                        ("ServingLoop._receive", "decode_loop.py", 127),
                    ),
                ),
            )
        ),
        "thread 'MainThread' tid 100 waits in select at ServingLoop._receive (decode_loop.py:127)",
    ),
]


def test_the_class_table_has_every_hang_class() -> None:
    assert [row[0] for row in CLASS_TABLE] == list(get_args(HangClass))


@pytest.mark.parametrize(("hang_class", "evidence", "named"), CLASS_TABLE, ids=[row[0] for row in CLASS_TABLE])
def test_every_hang_class_names_its_culprit_first(
    hang_class: str, evidence: Callable[[], Evidence], named: str
) -> None:
    """What capture does: classify, then the culprits (the collective rule's "never joined" rank first)."""
    ev = evidence()
    cls = classify(ev)
    assert cls.hang_class == hang_class, cls.reasons
    first = culprits(ev, 7.0, never_joined(cls))[0]
    line = first.line()
    assert line.startswith("Culprit: scheduler TP") and named in line, line
    assert line.endswith(", no progress for 7 s") and " in Thread.run" not in line, line
    if hang_class == "collective":
        assert first.evidence[0] == "this rank never joined the collective the other ranks wait in"
        assert " at load_weights (loader.py:80)" in line


# ---- the culprit is the process the evidence points at, whatever its role (issue 51) ----------------

FRONT, DETOK = 500, 600
_LOOP = (("EpollSelector.select", "selectors.py", 468), ("run_forever", "asyncio/base_events.py", 1))
_RECV = (("recv_pyobj", "zmq/sugar/socket.py", 990), ("event_loop", "detokenizer_manager.py", 1))


def stopped_proc(pid: int, role: str, rank: int | None, *frames: tuple[str, str, int]) -> ProcEvidence:
    """Stopped by SIGSTOP before any tool attached; pystack's frames of its main thread."""
    t = (sample((pid, "python", "T", "do_signal_stop"), (pid + 1, "python", "T", "do_signal_stop")),) * 2
    return ProcEvidence(pid, role, rank, "", t, python=(py(pid, "MainThread", *frames),), stopped=True)


def front_end(stopped: bool = False) -> ProcEvidence:
    """The HTTP front end: its event loop waits for clients in uvicorn's selector."""
    if stopped:
        return stopped_proc(FRONT, "main", None, *_LOOP)
    s = (sample((FRONT, "python", "S", "do_epoll_wait")),) * 2
    return ProcEvidence(FRONT, "main", None, "", s, python=(py(FRONT, "MainThread", *_LOOP),))


def detok(stopped: bool = False) -> ProcEvidence:
    if stopped:
        return stopped_proc(DETOK, "detokenizer", None, *_RECV)
    s = (sample((DETOK, "python", "S", "do_sys_poll")),) * 2
    return ProcEvidence(DETOK, "detokenizer", None, "", s, python=(py(DETOK, "MainThread", *_RECV),))


def rank_in(kind: str, rank: int) -> ProcEvidence:
    """A scheduler rank whose main thread shows `kind` of evidence."""
    pid = PID + 100 * (rank + 1)
    if kind == "stopped":
        return stopped_proc(pid, "scheduler", rank, ("event_loop_normal", "scheduler.py", 1))
    shapes: dict[str, tuple[str, str, StackThread]] = {
        "lock": ("S", "futex_do_wait", py(pid, "MainThread", ("acquire", "threading.py", 1), ("step", "s.py", 9))),
        "spins": ("R", "0", py(pid, "MainThread", ("event_loop_normal", "scheduler.py", 1), status="active+gil")),
        "peer": ("S", "do_sys_poll", py(pid, "MainThread", *_RECV[:1], ("recv_requests", "scheduler.py", 3))),
        "idle": ("S", "hrtimer_nanosleep", py(pid, "MainThread", ("sleep", "time.py", 1), ("on_idle", "s.py", 4))),
        "gil": (
            "S",
            "hrtimer_nanosleep",
            py(pid, "MainThread", ("init_attention_backends", "model_runner.py", 14), status="idle+gil"),
        ),
    }
    state, wchan, main = shapes[kind]
    return proc(sample((pid, "python", state, wchan)), main, pid=pid, rank=rank)


def tp(rank: int) -> int:
    return PID + 100 * (rank + 1)


# (case, the processes, the missing pids, the standing of each culprit in order, the first line's head)
RANKING = [
    (
        "a stopped front end beats a scheduler spinning in its loop (the H100 run)",
        lambda: (front_end(stopped=True), rank_in("spins", 0)),
        (),
        ["stopped", "spins"],
        f"Culprit: front end (main) pid {FRONT} thread 'MainThread' tid {FRONT} is stopped",
    ),
    (
        "a stopped front end beats idle ranks sleeping in their loops (the CPU stand-in)",
        lambda: (rank_in("idle", 0), rank_in("idle", 1), front_end(stopped=True)),
        (),
        ["stopped", "idle", "idle"],
        f"Culprit: front end (main) pid {FRONT} ",
    ),
    (
        "a stopped detokenizer beats ranks waiting for requests",
        lambda: (front_end(), rank_in("peer", 0), detok(stopped=True)),
        (),
        ["stopped", "peer"],
        f"Culprit: detokenizer pid {DETOK} thread 'MainThread' tid {DETOK} is stopped",
    ),
    (
        "one stopped rank of several beats its peers",
        lambda: (front_end(), detok(), rank_in("peer", 0), rank_in("peer", 1), rank_in("stopped", 2)),
        (),
        ["stopped", "peer", "peer"],
        f"Culprit: scheduler TP2 pid {tp(2)} ",
    ),
    (
        "blocked in a lock beats a spinner and a peer waiter",
        lambda: (rank_in("spins", 0), rank_in("peer", 1), rank_in("lock", 2), front_end()),
        (),
        ["blocked", "spins", "peer"],
        f"Culprit: scheduler TP2 pid {tp(2)} thread 'MainThread' tid {tp(2)} waits in acquire",
    ),
    (
        "the GIL held in native code beats a lock",
        lambda: (rank_in("lock", 0), rank_in("gil", 1)),
        (),
        ["gil_native", "blocked"],
        f"Culprit: scheduler TP1 pid {tp(1)} ",
    ),
    (
        "the rank that never joined beats a GIL holder",
        lambda: (rank_in("gil", 0), rank_in("peer", 1)),
        (tp(1),),
        ["halted", "gil_native"],
        f"Culprit: scheduler TP1 pid {tp(1)} ",
    ),
    (
        "waiting on a peer beats idle; at equal evidence the lowest rank",
        lambda: (rank_in("idle", 0), rank_in("peer", 2), rank_in("peer", 1)),
        (),
        ["peer", "peer", "idle"],
        f"Culprit: scheduler TP1 pid {tp(1)} ",
    ),
    (
        "at equal evidence a rank before the front end",
        lambda: (front_end(stopped=True), rank_in("stopped", 0)),
        (),
        ["stopped", "stopped"],
        f"Culprit: scheduler TP0 pid {tp(0)} ",
    ),
]


@pytest.mark.parametrize(("case", "processes", "missing", "standings", "head"), RANKING, ids=[r[0] for r in RANKING])
def test_candidates_are_ranked_by_their_evidence_whatever_their_role(
    case: str,
    processes: Callable[[], tuple[ProcEvidence, ...]],
    missing: tuple[int, ...],
    standings: list[str],
    head: str,
) -> None:
    named = culprits(Evidence(processes()), None, missing)
    assert [c.standing for c in named] == standings, (case, [(c.process, c.standing) for c in named])
    line = named[0].line()
    assert line.startswith(head), (case, line)
    assert named[0].doc()["standing"] == standings[0]


def test_a_stopped_front_end_says_why_it_matters_and_its_class_is_the_stop() -> None:
    ev = Evidence((rank_in("spins", 0), front_end(stopped=True)), tree_cpu_cores=1.0)
    first = culprits(ev, None)[0]
    assert first.evidence[0] == "the process is stopped by a signal: it runs no code"
    assert "HTTP front end" in first.evidence[1] and "every health check times out" in first.evidence[1]
    assert first.frames[0] == "EpollSelector.select (selectors.py:468)"  # where its loop stopped
    # The hang is the stop: the rank's loop turning with nothing to take does not make it busy.
    cls = classify(ev)
    assert cls.hang_class == "idle_deadlock", cls.reasons
    assert cls.reasons[0].startswith(f"main pid {FRONT} stopped (state T"), cls.reasons
    assert "also matched, lower precedence: busy_spin" in cls.reasons[-1], cls.reasons


def test_a_front_end_waiting_in_its_queue_is_no_candidate() -> None:
    """A front end's or a controller's main thread waits in a queue by design (vLLM's EngineCore in
    `input_queue.get`, the simulator's main in `Event.wait`): a lock wait there says nothing."""
    waits = py(FRONT, "MainThread", ("wait", "threading.py", 331), ("run", "server.py", 9))
    s = (sample((FRONT, "python", "S", "futex_do_wait")),) * 2
    queued = ProcEvidence(FRONT, "main", None, "", s, python=(waits,))
    named = culprits(Evidence((queued, rank_in("peer", 0))), None)
    assert [c.pid for c in named] == [tp(0)]


# ---- issue 51: a hang in each role (front end, detokenizer, scheduler, one rank of several) ---------

_ASYNCIO = (
    ("Handle._run", "asyncio/events.py", 80),
    ("BaseEventLoop._run_once", "asyncio/base_events.py", 1922),
    ("BaseEventLoop.run_forever", "asyncio/base_events.py", 607),
    ("Runner.run", "asyncio/runners.py", 118),
    ("MainProcess.run", "sglang/srt/entrypoints/http_server.py", 170),
)
_TURNING = (("EpollSelector.select", "selectors.py", 468), *_ASYNCIO[1:])
_UPDATE = ("TokenizerManager.wait_for_model_update", "sglang/srt/managers/tokenizer_manager.py", 164)


def front_loop(
    top: tuple[tuple[str, str, int], ...], state: str = "S", wchan: str = "futex_do_wait", **kw: str
) -> ProcEvidence:
    """The front end's main thread running its event loop, with `top` above the loop's frames."""
    s = (sample((FRONT, "python", state, wchan)),) * 2
    return ProcEvidence(FRONT, "main", None, "", s, python=(py(FRONT, "MainThread", *top, **kw),))


def front_blocked() -> ProcEvidence:
    return front_loop((_UPDATE, *_ASYNCIO))


def detok_blocked() -> ProcEvidence:
    s = (sample((DETOK, "python", "S", "futex_do_wait")),) * 2
    decode = py(
        DETOK,
        "MainThread",
        ("DetokenizerManager.batch_decode", "detokenizer_manager.py", 48),
        ("DetokenizerManager.handle_batch_token_id_out", "detokenizer_manager.py", 44),
        ("event_loop", "detokenizer_manager.py", 80),
    )
    return ProcEvidence(DETOK, "detokenizer", None, "", s, python=(decode,))


def rank_waits(rank: int, where: str = "all_reduce") -> ProcEvidence:
    """A rank inside the forward's collective, waiting for a peer's share."""
    pid = tp(rank)
    main = py(
        pid,
        "MainThread",
        ("Connection._recv", "multiprocessing/connection.py", 395),
        (where, "torch/distributed/distributed_c10d.py", 30),
        ("ServingLoop._forward", "scheduler.py", 193),
    )
    return proc(sample((pid, "python", "S", "pipe_read")), main, pid=pid, rank=rank)


def rank_between(rank: int, how: str = "poll") -> ProcEvidence:
    """A rank idle in its own loop, in no collective: waiting for rank 0's next batch."""
    pid = tp(rank)
    top = {
        "poll": [("_PollLikeSelector.select", "selectors.py", 415), ("follow", "scheduler.py", 41)],
        # SGLang's ranks > 0 wait for the next batch in broadcast_pyobj: their idle loop, not a collective
        "broadcast": [
            ("broadcast", "torch/distributed/distributed_c10d.py", 2400),
            ("broadcast_pyobj", "sglang/srt/utils.py", 900),
            ("Scheduler.recv_requests", "scheduler.py", 1000),
        ],
    }[how]
    main = py(pid, "MainThread", *top, ("event_loop_normal", "scheduler.py", 9))
    return proc(sample((pid, "python", "S", "do_sys_poll")), main, pid=pid, rank=rank)


_LOOP_WHY = "; event loop blocked in TokenizerManager.wait_for_model_update"
_SKIP_WHY = "; idle while ranks 0-1 wait in all_reduce: skipped the collective"

# (case, the processes, the missing pids, the standing of each culprit in order, line 1's head, line 1 has)
ROLES = [
    (
        "front end: its event loop blocked in a callback beats ranks waiting for requests",
        lambda: (rank_in("peer", 0), rank_in("peer", 1), detok(), front_blocked()),
        (),
        ["blocked", "peer", "peer"],
        f"Culprit: front end (main) pid {FRONT} thread 'MainThread' tid {FRONT} waits in futex_do_wait",
        _LOOP_WHY,
    ),
    (
        "front end: on uvloop (no loop frame but asyncio's runner) a blocked coroutine is named",
        lambda: (
            rank_in("idle", 0),
            front_loop(
                (("TokenizerManager.handle_loop", "tokenizer_manager.py", 9), ("Runner.run", "asyncio/runners.py", 118))
            ),
        ),
        (),
        ["blocked", "idle"],
        f"Culprit: front end (main) pid {FRONT} ",
        "; event loop blocked in TokenizerManager.handle_loop",
    ),
    (
        "front end: a loop spinning in a callback in every sample beats idle ranks",
        lambda: (rank_in("idle", 0), front_loop((_UPDATE, *_ASYNCIO), "R", "0", status="active")),
        (),
        ["spins", "idle"],
        f"Culprit: front end (main) pid {FRONT} thread 'MainThread' tid {FRONT} runs",
        "; event loop spins in TokenizerManager.wait_for_model_update",
    ),
    (
        "front end: at equal evidence a spinning rank before a spinning loop",
        lambda: (front_loop((_UPDATE, *_ASYNCIO), "R", "0", status="active"), rank_in("spins", 1)),
        (),
        ["spins", "spins"],
        f"Culprit: scheduler TP1 pid {tp(1)} ",
        "",
    ),
    (
        "front end: its turning loop (in its selector) is no candidate",
        lambda: (rank_in("peer", 0), front_loop(_TURNING, wchan="do_epoll_wait")),
        (),
        ["peer"],
        f"Culprit: scheduler TP0 pid {tp(0)} ",
        "",
    ),
    (
        "front end: a turning uvloop (asyncio's runner innermost) is no candidate",
        lambda: (rank_in("idle", 0), front_loop((("Runner.run", "asyncio/runners.py", 118),), wchan="do_epoll_wait")),
        (),
        ["idle"],
        f"Culprit: scheduler TP0 pid {tp(0)} ",
        "",
    ),
    (
        "front end: a callback caught running in one sample only is no candidate",
        lambda: (
            rank_in("peer", 0),
            ProcEvidence(
                FRONT,
                "main",
                None,
                "",
                (sample((FRONT, "python", "S", "do_epoll_wait")), sample((FRONT, "python", "R", "0"))),
                python=(py(FRONT, "MainThread", _UPDATE, *_ASYNCIO, status="active"),),
            ),
        ),
        (),
        ["peer"],
        f"Culprit: scheduler TP0 pid {tp(0)} ",
        "",
    ),
    (
        "detokenizer: blocked in a lock in its own code beats ranks idle after finishing",
        lambda: (front_end(), rank_in("peer", 0), rank_in("idle", 1), detok_blocked()),
        (),
        ["blocked", "peer", "idle"],
        f"Culprit: detokenizer pid {DETOK} thread 'MainThread' tid {DETOK} waits in futex_do_wait",
        "; holds the requests: blocked in DetokenizerManager.batch_decode",
    ),
    (
        "detokenizer: at equal evidence a rank blocked in a lock comes first",
        lambda: (detok_blocked(), rank_in("lock", 1), front_end()),
        (),
        ["blocked", "blocked"],
        f"Culprit: scheduler TP1 pid {tp(1)} thread 'MainThread' tid {tp(1)} waits in acquire",
        "",
    ),
    (
        "detokenizer: stopped beats a blocked front-end loop",
        lambda: (front_blocked(), rank_in("peer", 0), detok(stopped=True)),
        (),
        ["stopped", "blocked", "peer"],
        f"Culprit: detokenizer pid {DETOK} thread 'MainThread' tid {DETOK} is stopped",
        "",
    ),
    (
        "scheduler: a rank blocked in its forward beats its peer waiting for rank 0",
        lambda: (front_end(), detok(), rank_in("lock", 0), rank_between(1)),
        (),
        ["blocked", "peer"],
        f"Culprit: scheduler TP0 pid {tp(0)} thread 'MainThread' tid {tp(0)} waits in acquire",
        "",
    ),
    (
        "one rank of several: idle in its loop while the others wait in all_reduce (SGLang #33289)",
        lambda: (front_end(), detok(), rank_waits(0), rank_waits(1), rank_between(2)),
        (),
        ["halted", "peer", "peer"],
        f"Culprit: scheduler TP2 pid {tp(2)} thread 'MainThread' tid {tp(2)} waits in select at follow",
        _SKIP_WHY,
    ),
    (
        "one rank of several: at tp 2 the idle one, whichever rank it is",
        lambda: (rank_between(0), rank_waits(1)),
        (),
        ["halted", "peer"],
        f"Culprit: scheduler TP0 pid {tp(0)} ",
        "; idle while rank 1 waits in all_reduce: skipped the collective",
    ),
    (
        "one rank of several: idle in broadcast_pyobj (SGLang's idle loop of ranks > 0) still skipped",
        lambda: (rank_waits(0), rank_waits(1), rank_between(3, "broadcast"), rank_waits(2, "all_gather_into_tensor")),
        (),
        ["halted", "peer", "peer", "peer"],
        f"Culprit: scheduler TP3 pid {tp(3)} ",
        "; idle while ranks 0-2 wait in all_reduce: skipped the collective",
    ),
    (
        "one rank of several: every rank in the collective names no skipper (the lowest rank)",
        lambda: (rank_waits(1), rank_waits(0)),
        (),
        ["peer", "peer"],
        f"Culprit: scheduler TP0 pid {tp(0)} ",
        "",
    ),
    (
        "one rank of several: a stopped rank is named, and the idle one is not called a skipper",
        lambda: (rank_waits(0), rank_in("stopped", 1), rank_between(2)),
        (),
        ["stopped", "peer", "peer"],
        f"Culprit: scheduler TP1 pid {tp(1)} ",
        "",
    ),
    (
        "one rank of several: a rank blocked outside the collective beats an idle one (no skipper)",
        lambda: (rank_waits(0), rank_in("lock", 1), rank_between(2)),
        (),
        ["blocked", "peer", "peer"],
        f"Culprit: scheduler TP1 pid {tp(1)} thread 'MainThread' tid {tp(1)} waits in acquire",
        "",
    ),
    (
        "one rank of several: the skipper beats a blocked front end",
        lambda: (front_blocked(), rank_waits(0), rank_between(1)),
        (),
        ["halted", "blocked", "peer"],
        f"Culprit: scheduler TP1 pid {tp(1)} ",
        "; idle while rank 0 waits in all_reduce: skipped the collective",
    ),
]


@pytest.mark.parametrize(("case", "processes", "missing", "standings", "head", "has"), ROLES, ids=[r[0] for r in ROLES])
def test_each_roles_hang_puts_its_process_first_with_why(
    case: str,
    processes: Callable[[], tuple[ProcEvidence, ...]],
    missing: tuple[int, ...],
    standings: list[str],
    head: str,
    has: str,
) -> None:
    named = culprits(Evidence(processes()), None, missing)
    assert [c.standing for c in named] == standings, (case, [(c.process, c.standing, c.why) for c in named])
    line = named[0].line()
    assert line.startswith(head), (case, line)
    if has:
        assert line.endswith(has), (case, line)  # the short why closes line 1 (no held figure here)
        assert named[0].doc()["why"] == has.removeprefix("; ")
    else:
        assert "; " not in line.removeprefix(head), (case, line)


def test_a_blocked_front_end_says_why_and_where_its_loop_stopped() -> None:
    first = culprits(Evidence((rank_in("peer", 0), front_blocked())), 12.0)[0]
    assert first.cue == "loop" and first.frames[0] == f"{_UPDATE[0]} ({_UPDATE[1]}:164)"
    assert first.evidence[0].startswith(
        "its event loop does not turn: the callback TokenizerManager.wait_for_model_update"
    )
    assert "every health check times out" in first.evidence[1]
    assert first.line().endswith(f"{_LOOP_WHY}, no progress for 12 s")


def test_the_skipped_rank_is_named_once_when_the_collective_rule_also_names_it() -> None:
    ev = Evidence((rank_waits(0), rank_waits(1), rank_between(2)))
    (first, *_) = culprits(ev, None, never_joined(classify(ev)))
    assert first.pid == tp(2) and first.standing == "halted" and first.cue == "skipped"
    assert first.evidence[0].startswith(
        "it is idle in its own loop, in no collective, while ranks 0-1 wait in all_reduce"
    )
    assert not any("never joined" in e for e in first.evidence), first.evidence


def test_a_detokenizer_waiting_for_rank_0_or_in_a_queue_is_no_candidate() -> None:
    queued = py(DETOK, "MainThread", ("get", "queue.py", 171), ("event_loop", "detokenizer_manager.py", 80))
    s = (sample((DETOK, "python", "S", "futex_do_wait")),) * 2
    for d in (detok(), ProcEvidence(DETOK, "detokenizer", None, "", s, python=(queued,))):
        assert [c.pid for c in culprits(Evidence((d, rank_in("idle", 0))), None)] == [tp(0)]
