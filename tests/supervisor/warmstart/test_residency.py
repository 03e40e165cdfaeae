"""Weights' page-cache residency through mincore, and read-ahead (real files, real system calls)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from supervisor.warmstart import residency
from supervisor.warmstart.residency import measure, read_ahead, weight_files


def model(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    (d / "a.safetensors").write_bytes(os.urandom(2 * 1024 * 1024))
    (d / "sub" / "b.bin").write_bytes(os.urandom(1024 * 1024))
    (d / "config.json").write_text("{}")
    return d


def test_weight_files_of_a_directory_a_file_and_a_hub_id(tmp_path: Path) -> None:
    d = model(tmp_path)
    assert [f.name for f in weight_files(str(d), 100)] == ["a.safetensors", "b.bin"]
    assert weight_files(str(d), 1) == [d / "a.safetensors"]
    assert weight_files(str(d / "a.safetensors"), 10) == [d / "a.safetensors"]
    assert weight_files("meta-llama/Llama-3-8B", 10) == [] and weight_files("", 10) == []


def test_files_just_written_and_read_are_resident(tmp_path: Path) -> None:
    files = weight_files(str(model(tmp_path)), 100)
    for f in files:
        f.read_bytes()
    r = measure(files)
    assert r.error is None and r.files == 2 and r.bytes == 3 * 1024 * 1024
    assert r.fraction > 0.9, r
    assert read_ahead(files) is None


def test_a_file_that_cannot_be_opened_is_named_not_fatal(tmp_path: Path) -> None:
    files = weight_files(str(model(tmp_path)), 100)
    files[0].unlink()
    r = measure(files)
    assert r.files == 2 and r.bytes == 1024 * 1024 and r.error is not None and "a.safetensors" in r.error
    assert "a.safetensors" in (read_ahead(files) or "")


def test_an_empty_file_counts_nothing(tmp_path: Path) -> None:
    f = tmp_path / "empty.safetensors"
    f.write_bytes(b"")
    r = measure([f])
    assert (r.bytes, r.resident_bytes, r.fraction, r.error) == (0, 0, 0.0, None)


def test_read_ahead_brings_evicted_weights_back_into_the_page_cache(tmp_path: Path) -> None:
    """The relaunch's weights were evicted (another job's reads, memory pressure): the read-ahead the
    daemon asks for while the evidence is captured brings them back before the relaunch reads them."""
    f = tmp_path / "model-00001-of-00001.safetensors"
    with open(f, "wb") as out:
        out.write(os.urandom(16 * 1024 * 1024))
        out.flush()
        os.fsync(out.fileno())
    fd = os.open(f, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages: the kernel drops them
    finally:
        os.close(fd)
    evicted = residency.measure([f])
    if evicted.fraction > 0.5:
        pytest.skip(f"this filesystem kept the pages after POSIX_FADV_DONTNEED ({evicted.fraction:.0%} resident)")
    assert residency.read_ahead([f]) is None
    deadline = time.monotonic() + 30
    while residency.measure([f]).fraction < 0.9 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert residency.measure([f]).fraction >= 0.9, (evicted, residency.measure([f]))
