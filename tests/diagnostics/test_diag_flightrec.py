"""NCCL Flight Recorder (issue 35): the launch variables, the pure judgement, and the capture path
with real FIFOs, real rank processes and the analyzer run as a child with a real Python."""

from __future__ import annotations

import os
import subprocess
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
FR_TORCH_RANK = str(Path(__file__).parents[1] / "support" / "fr_torch_rank.py")


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


@pytest.mark.integration  # waits out the dump bound
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
    # Nor did torch's analyzer (pickle's full loader) get the file: it runs on plain data only.
    assert report.analyzer.startswith("torch's analyzer not run: not every dump read as plain data"), report.analyzer


async def test_real_torch_ranks_on_the_cpu_one_never_entering_the_collective(tmp_path: Path) -> None:
    """Two real gloo ranks (torch 2.13 CPU: `pip install torch==2.13.0`); rank 1 never enters the
    second all_reduce. The daemon's path as at a hang: pipes written, dumps (torch's own pickles)
    waited for, read by the rank's Python with the class-refusing loader, torch's analyzer run, and
    the verdict names rank 1 as the rank the other waits for."""
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0: a CPU wheel)")
    env = {**fr_env(tmp_path), "TORCH_FR_BUFFER_SIZE": "100", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    store = str(tmp_path / "store")
    ranks = [  # both at once: each waits in init_process_group for the other
        subprocess.Popen(
            [sys.executable, FR_TORCH_RANK, str(r), "2", store], stdout=subprocess.PIPE, text=True, env=env
        )
        for r in (0, 1)
    ]
    try:
        for p in ranks:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        # A generous bound on a loaded machine: the wait ends as soon as both dumps are in.
        report = await flight_record(env, [p.pid for p in ranks], [sys.executable], wait_s=30.0)
    finally:
        for p in ranks:
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
    assert report.status == "ok", report
    assert sorted(report.dumps) == [0, 1], report
    v = report.verdict
    assert v is not None and v.mismatch == "lagging_ranks" and v.lagging_ranks == (1,), v
    assert v.collective == "gloo:all_reduce" and v.seq == 2, v
    assert "rank(s) 1 stopped before it (at #1)" in v.text, v.text
    read = {d.rank: d for d in report.read}
    # torch's ring as torch wrote it (gloo records no completion: every entry reads "scheduled").
    assert [e.seq for e in read[0].entries] == [1, 2] and [e.seq for e in read[1].entries] == [1]
    files = bundle_files(report)
    assert files["fr-dump-rank0.pickle"].startswith(b"\x80")  # the pickle kept as torch wrote it
    # torch's analyzer ran with the ranks' own interpreter (the venv's: its torch), not the base one;
    # what it says is kept as it is (torch 2.13's fr_trace raises KeyError on gloo's dumps).
    assert report.analyzer and "No module named" not in report.analyzer, report.analyzer[:500]
