"""The clean slate removes a shared-memory segment only with proof that this daemon's tree made it
and that it is dead (supervisor.daemon.shmledger, cleanslate.stale_shm): real segments in a private
directory, real processes mapping them, real file owners, the ledger written by real notes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from saying import saying_children

from supervisor.daemon import shmledger

Mapper = Callable[[Path], "subprocess.Popen[str]"]

MAPPER = """
import mmap, sys, time
f = open(sys.argv[1], "r+b")
m = mmap.mmap(f.fileno(), 4096)
f.close()  # held by the mapping alone
print("mapped", flush=True)
time.sleep(60)
"""


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def segment(shm: Path, name: str) -> Path:
    path = shm / name
    path.write_bytes(b"\0" * 4096)
    return path


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    shm, state = tmp_path / "shm", tmp_path / "state"
    shm.mkdir()
    state.mkdir()
    return shm, state


@pytest.fixture
def mapper() -> Iterator[Mapper]:
    with saying_children() as start:
        yield lambda path: start([sys.executable, "-c", MAPPER, str(path)], "mapped")


def ledger_of(state: Path, pids: list[int], names: list[str]) -> None:
    doc = {"boot": shmledger.boot_id(), "pids": pids, "names": names}
    (state / shmledger.LEDGER_NAME).write_text(json.dumps(doc))


def names(shm: Path) -> list[str]:
    return sorted(p.name for p in shm.iterdir())


def test_a_dead_creator_of_our_tree_unmapped_and_ours_is_removed(dirs: tuple[Path, Path]) -> None:
    shm, state = dirs
    ours, stranger = dead_pid(), dead_pid()
    segment(shm, f"sgl_shm_mq_{ours}_aa")
    segment(shm, f"sgl_shm_mq_{stranger}_bb")  # a creator that reads as gone but was never ours
    ledger_of(state, [ours], [])
    removed, errors = shmledger.sweep(shm, state)
    assert [s.name for s in removed] == [f"sgl_shm_mq_{ours}_aa"] and errors == []
    assert names(shm) == [f"sgl_shm_mq_{stranger}_bb"]


def test_a_pid_named_segment_a_live_unrelated_process_maps_is_kept(dirs: tuple[Path, Path], mapper: Mapper) -> None:
    shm, state = dirs
    pid = dead_pid()
    path = segment(shm, f"sgl_shm_mq_{pid}_aa")
    ledger_of(state, [pid], [])
    holder = mapper(path)
    removed, _ = shmledger.sweep(shm, state)
    assert removed == [] and path.exists() and holder.poll() is None
    holder.kill()
    holder.wait()
    removed, _ = shmledger.sweep(shm, state)  # the same segment, once nobody maps it
    assert [s.name for s in removed] == [path.name] and not path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_another_users_segment_is_kept(dirs: tuple[Path, Path]) -> None:
    shm, state = dirs
    pid = dead_pid()
    theirs = segment(shm, f"sgl_shm_mq_{pid}_aa")
    psm = segment(shm, "psm_0a1b2c")
    nobody = 65534
    os.chown(theirs, nobody, nobody)
    os.chown(psm, nobody, nobody)
    ledger_of(state, [pid], ["psm_0a1b2c"])
    removed, _ = shmledger.sweep(shm, state)
    assert removed == [] and names(shm) == sorted([theirs.name, psm.name])


def test_a_psm_segment_is_removed_only_when_recorded_as_ours(dirs: tuple[Path, Path]) -> None:
    shm, state = dirs
    segment(shm, "psm_1234abcd")  # any Python program's default name, never seen in our tree
    segment(shm, "psm_5678abcd")
    ledger_of(state, [], ["psm_5678abcd"])
    removed, _ = shmledger.sweep(shm, state)
    assert [s.name for s in removed] == ["psm_5678abcd"] and names(shm) == ["psm_1234abcd"]


def test_the_ledger_records_what_the_tree_maps_and_the_sweep_removes_it_once_unmapped(
    dirs: tuple[Path, Path],
    mapper: Mapper,
) -> None:
    shm, state = dirs
    mine = segment(shm, "psm_00aa11bb")
    other = segment(shm, "psm_22cc33dd")
    tree = mapper(mine)
    stranger = mapper(other)  # maps one too, but is not the daemon's tree
    clock = [0.0]
    ledger = shmledger.ShmLedger(state, lambda: clock[0])
    assert ledger.due([tree.pid])
    ledger.note([tree.pid], str(shm))
    assert not ledger.due([tree.pid])  # the same pids, soon after: no scan
    clock[0] += shmledger.SCAN_EVERY_S
    assert ledger.due([tree.pid])
    recorded = shmledger.load(state, shmledger.boot_id())
    assert recorded.names == {mine.name} and recorded.pids == {tree.pid}
    assert shmledger.sweep(shm, state)[0] == []  # still mapped
    tree.kill()
    tree.wait()
    stranger.kill()
    stranger.wait()
    removed, _ = shmledger.sweep(shm, state)
    assert [s.name for s in removed] == [mine.name] and names(shm) == [other.name]


def test_quiet_scans_back_off_and_a_new_segment_or_pid_brings_the_short_interval_back(
    dirs: tuple[Path, Path],
    mapper: Mapper,
) -> None:
    """Issue 51: each scan reads every member's maps; while nothing new is found they come less often."""
    shm, state = dirs
    first = segment(shm, "psm_00aa11bb")
    tree = mapper(first)
    clock = [0.0]
    ledger = shmledger.ShmLedger(state, lambda: clock[0])
    ledger.note([tree.pid], str(shm))  # new pids: the next in SCAN_EVERY_S
    gaps = []
    for _ in range(6):
        gap = 0.0
        while not ledger.due([tree.pid]):
            clock[0] += 1.0
            gap += 1.0
        gaps.append(gap)
        ledger.note([tree.pid], str(shm))
    every = shmledger.SCAN_EVERY_S
    assert gaps == [every, 2 * every, 4 * every, shmledger.SCAN_MAX_S, shmledger.SCAN_MAX_S, shmledger.SCAN_MAX_S]
    assert ledger.due([tree.pid, 4_000_000])  # the tree changed: at once
    second = segment(shm, "psm_44ee55ff")
    other = mapper(second)
    ledger.note([tree.pid, other.pid], str(shm))
    clock[0] += every
    assert ledger.due([tree.pid, other.pid])  # a new segment: the short interval again
    assert shmledger.load(state, shmledger.boot_id()).names == {first.name, second.name}
    for proc in (tree, other):
        proc.kill()
        proc.wait()


def test_a_ledger_of_another_boot_or_malformed_proves_nothing(dirs: tuple[Path, Path]) -> None:
    shm, state = dirs
    pid = dead_pid()
    segment(shm, f"sgl_shm_mq_{pid}_aa")
    (state / shmledger.LEDGER_NAME).write_text(json.dumps({"boot": "another-boot", "pids": [pid], "names": []}))
    assert shmledger.sweep(shm, state) == ([], [])
    (state / shmledger.LEDGER_NAME).write_text('{"boot": 1, "pids": "x"')
    assert shmledger.sweep(shm, state) == ([], [])
    assert names(shm) == [f"sgl_shm_mq_{pid}_aa"]
