"""NCCL Flight Recorder (issue 35): the launch variables, the pure judgement, and the capture path
with real FIFOs, real rank processes and the analyzer run as a child with a real Python."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from saying import saying_children

from supervisor.diagnostics.flightrec import (
    DUMP_KEY,
    PIPE_KEY,
    FrDump,
    FrEntry,
    bundle_files,
    flight_record,
    judge,
    launch_env,
)

FR_RANK = str(Path(__file__).parents[1] / "support" / "fr_rank.py")


def test_launch_env_sets_what_the_operator_did_not(tmp_path: Path) -> None:
    env = launch_env({}, tmp_path / "fr", 2000)
    assert env == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_FR_BUFFER_SIZE": "2000",
        PIPE_KEY: str(tmp_path / "fr" / "pipe_rank_"),
        DUMP_KEY: str(tmp_path / "fr" / "nccl_trace_rank_"),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }
    assert (tmp_path / "fr").is_dir()
    # An operator's own buffer (either name), pipe or dump-on-timeout is theirs: not overridden.
    mine = {"TORCH_FR_BUFFER_SIZE": "64", PIPE_KEY: "/x/p", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    assert launch_env(mine, tmp_path / "fr", 2000) == {DUMP_KEY: str(tmp_path / "fr" / "nccl_trace_rank_")}
    assert launch_env({}, None, 2000) == {}  # [diagnostics] flight_recorder = false
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert launch_env({}, blocked / "fr", 2000) == {}  # a directory that cannot be made: off, no raise


def ring(rank: int, last: int, state: str = "completed", pg: str = "0", name: str = "nccl:all_reduce") -> FrDump:
    entries = tuple(FrEntry(pg, i, name, state if i == last else "completed") for i in range(1, last + 1))
    return FrDump(rank, entries)


@pytest.mark.parametrize(
    ("dumps", "expected", "mismatch", "lagging", "missing", "words"),
    [
        ([ring(0, 7, "started"), ring(1, 6)], [0, 1], "lagging_ranks", (1,), (), "rank(s) 1 stopped before it"),
        ([ring(0, 7, "started"), ring(1, 7, "started")], [0, 1], "in_flight", (), (), "every rank is inside"),
        ([ring(0, 7), ring(1, 7)], [0, 1], "none_in_flight", (), (), "outside torch.distributed"),
        ([ring(0, 7, "started")], [0, 1], "in_flight", (), (1,), "rank(s) 1 wrote no dump"),
        ([], [0, 1], "missing_ranks", (), (0, 1), "wrote no dump"),
        (
            [ring(0, 3, "started"), ring(1, 3, "started", name="nccl:all_gather")],
            [0, 1],
            "collective_mismatch",
            (),
            (),
            "different collectives",
        ),
        # A lag in one group outranks a collective merely in flight in another.
        (
            [FrDump(0, (*ring(0, 4, "started").entries, *ring(0, 9, pg="1").entries)), ring(1, 2)],
            [0, 1],
            "lagging_ranks",
            (1,),
            (),
            "process group 0",
        ),
    ],
)
def test_judge_names_the_collective_and_the_ranks(dumps, expected, mismatch, lagging, missing, words) -> None:  # type: ignore[no-untyped-def]
    v = judge(dumps, expected)
    assert v.mismatch == mismatch and v.lagging_ranks == lagging and v.missing_ranks == missing, v
    assert words in v.text, v.text
    if mismatch in ("lagging_ranks", "in_flight"):
        assert v.collective == "nccl:all_reduce" and v.pg == "0"


def fr_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        PIPE_KEY: str(tmp_path / "pipe_rank_"),
        DUMP_KEY: str(tmp_path / "nccl_trace_rank_"),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }


async def test_a_rank_that_never_entered_the_collective_is_named(tmp_path: Path) -> None:
    env = fr_env(tmp_path)
    with saying_children() as start:
        r0 = start([sys.executable, FR_RANK, "0", "12", "started"], "ready", env)
        r1 = start([sys.executable, FR_RANK, "1", "11", "completed"], "ready", env)
        report = await flight_record(env, [r0.pid, r1.pid], [sys.executable], wait_s=10.0)
    assert report.status == "ok", report
    assert sorted(report.dumps) == [0, 1] and {p.outcome for p in report.pipes} == {"written"}
    v = report.verdict
    assert v is not None and v.mismatch == "lagging_ranks" and v.lagging_ranks == (1,), v
    assert v.collective == "nccl:all_reduce" and v.seq == 12
    files = bundle_files(report)
    assert set(files) >= {"fr-dump-rank0.pickle", "fr-dump-rank1.pickle"}
    doc = report.doc()
    assert doc["lagging_ranks"] == [1] and doc["mismatch"] == "lagging_ranks"
    assert "fr-trace.txt" not in files or files["fr-trace.txt"]  # torch's analyzer: only where torch is


async def test_no_pipe_says_fr_had_nothing_and_a_stale_pipe_is_no_reader(tmp_path: Path) -> None:
    env = fr_env(tmp_path)
    report = await flight_record(env, [], [sys.executable], wait_s=5.0)
    assert report.status == "nothing" and "no torch.distributed NCCL process group" in report.reason
    os.mkfifo(tmp_path / "pipe_rank_3.pipe")  # a rank that died and left its FIFO
    report = await flight_record(env, [], [sys.executable], wait_s=5.0)
    assert report.status == "nothing" and [p.outcome for p in report.pipes] == ["no reader"]
    off = await flight_record(dict(os.environ), [], [sys.executable], wait_s=5.0)
    assert off.status == "off"


async def test_a_pipe_written_but_no_dump_waits_only_the_bound(tmp_path: Path) -> None:
    env = fr_env(tmp_path)
    fifo = tmp_path / "pipe_rank_0.pipe"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never dumps (a rank frozen mid-way)
    try:
        report = await flight_record(env, [], [sys.executable], wait_s=1.0)
    finally:
        os.close(fd)
    assert report.status == "no_dumps" and "no dump within 1 s" in report.reason
    assert report.wait_s < 5.0


async def test_a_hostile_dump_is_refused_not_run(tmp_path: Path) -> None:
    mark = tmp_path / "evil-ran"
    env = {**fr_env(tmp_path), "FR_EVIL_MARK": str(mark)}
    with saying_children() as start:
        r0 = start([sys.executable, FR_RANK, "0", "1", "started", "hostile"], "ready", env)
        report = await flight_record(env, [r0.pid], [sys.executable], wait_s=10.0)
    assert report.status == "ok", report
    assert not mark.exists()  # the pickle's os.system never ran: frdump refuses every class
    errors = report.doc()["errors"]
    assert isinstance(errors, list) and errors and "refused class" in str(errors[0])


async def test_real_torch_ranks_on_the_cpu_dump_through_the_pipe(tmp_path: Path) -> None:
    """With torch installed: real gloo ranks. torch's pipe is read by ProcessGroupNCCL's heartbeat
    monitor only, so on the CPU the check is that gloo's ring records and dumps through torch's API."""
    torch = pytest.importorskip("torch", reason="torch is not installed (CI: pip install torch from the cpu index)")
    c10d = torch._C._distributed_c10d
    dumper = getattr(c10d, "_dump_fr_trace_json", None) or getattr(c10d, "_dump_fr_trace", None)
    if dumper is None:
        pytest.skip(f"torch {torch.__version__} has no CPU Flight Recorder dump API (_dump_fr_trace)")
    import torch.distributed as dist

    os.environ.update({"TORCH_FR_BUFFER_SIZE": "100", "TORCH_NCCL_TRACE_BUFFER_SIZE": "100"})
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dist.all_reduce(torch.ones(4))
        raw = dumper()
    finally:
        dist.destroy_process_group()
    assert raw, "gloo's Flight Recorder recorded nothing"
