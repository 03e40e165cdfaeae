from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from supervisor.diagnostics import bundle
from supervisor.diagnostics.bundle import enforce_retention


def make(diag: Path, name: str, size: int = 10, age_s: float = 0.0) -> Path:
    d = diag / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"id": name, "hang_class": "unknown"}))
    (d / "blob.txt").write_bytes(b"x" * size)
    t = time.time() - age_s
    os.utime(d, (t, t))
    return d


def test_write_is_atomic_and_fsynced(tmp_path: Path) -> None:
    diag = tmp_path / "diagnostics"
    path = bundle.write_bundle(diag, "20261129T144501Z-manual", {"summary.json": b"{}", "a.txt": b"hello"})
    assert path == diag / "20261129T144501Z-manual"
    assert (path / "a.txt").read_bytes() == b"hello"
    assert [p.name for p in diag.iterdir()] == [path.name]  # no .tmp- left behind


def test_write_under_a_file_raises_and_leaves_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        bundle.write_bundle(blocker / "diagnostics", "x", {"a": b"1"})


def test_full_disk_midway_removes_the_partial_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = bundle._write_file
    calls = []

    def enospc_on_second(path: Path, data: bytes) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(bundle, "_write_file", enospc_on_second)
    with pytest.raises(OSError, match="No space left"):
        bundle.write_bundle(tmp_path, "b1", {"a": b"1", "b": b"2", "c": b"3"})
    assert list(tmp_path.iterdir()) == []


def test_unique_id_suffixes_a_second_bundle_in_the_same_second(tmp_path: Path) -> None:
    make(tmp_path, "20261129T144501Z-manual")
    assert bundle.unique_id(tmp_path, "20261129T144501Z-manual") == "20261129T144501Z-manual-2"
    assert bundle.unique_id(tmp_path, "other") == "other"


def test_retention_by_count_deletes_oldest_first(tmp_path: Path) -> None:
    for i in range(5):
        make(tmp_path, f"b{i}", age_s=100 - i)  # b0 oldest
    removed, errors = enforce_retention(tmp_path, keep=3, max_bytes=10**9, protect="b4")
    assert removed == ["b0", "b1"] and errors == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b2", "b3", "b4"]


def test_retention_by_size(tmp_path: Path) -> None:
    for i in range(4):
        make(tmp_path, f"b{i}", size=1000, age_s=100 - i)
    removed, _ = enforce_retention(tmp_path, keep=100, max_bytes=2 * 1100, protect="b3")
    assert removed == ["b0", "b1"]


def test_retention_never_deletes_the_bundle_just_written(tmp_path: Path) -> None:
    make(tmp_path, "old", size=10, age_s=50)
    make(tmp_path, "new-but-huge", size=5000, age_s=0)
    removed, _ = enforce_retention(tmp_path, keep=1, max_bytes=100, protect="new-but-huge")
    assert removed == ["old"]
    assert (tmp_path / "new-but-huge").is_dir()


def test_retention_ignores_foreign_directories_and_clears_stale_tmp(tmp_path: Path) -> None:
    (tmp_path / "not-a-bundle").mkdir()  # no summary.json: not ours to delete
    stale = tmp_path / ".tmp-crashed"
    stale.mkdir()
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = tmp_path / ".tmp-in-progress"
    fresh.mkdir()
    make(tmp_path, "b0")
    removed, _ = enforce_retention(tmp_path, keep=1, max_bytes=10**9, protect="b0")
    assert removed == []
    assert (tmp_path / "not-a-bundle").is_dir() and fresh.is_dir() and not stale.exists()


@pytest.mark.parametrize(
    ("wanted", "safe"),
    [
        ("20261129T144501Z-startup_stall", "20261129T144501Z-startup_stall"),
        ("../x y", "_x_y"),
        ("...", "incident"),
    ],
)
def test_safe_id(wanted: str, safe: str) -> None:
    assert bundle.safe_id(wanted) == safe


def test_new_incident_id_is_utc_time_then_cause() -> None:
    from supervisor.diagnostics import new_incident_id

    assert new_incident_id(1795963501.0, "startup_stall") == "20261129T144501Z-startup_stall"
    assert new_incident_id(1795963501.0, None) == "20261129T144501Z-manual"
