from __future__ import annotations

from pathlib import Path

from supervisor.daemon.evidence import KEEP, unique_incident_id


def test_ids_in_one_second_get_suffixes(tmp_path: Path) -> None:
    taken: list[str] = []
    first = unique_incident_id(1_796_000_000.2, "exited", taken, tmp_path)
    second = unique_incident_id(1_796_000_000.48, "exited", taken, tmp_path)  # 0.28 s later, the same second
    third = unique_incident_id(1_796_000_000.48, "exited", taken, tmp_path)
    assert second == f"{first}-2" and third == f"{first}-3"
    assert unique_incident_id(1_796_000_000.48, "manual", taken, tmp_path) != first  # another cause: its own id


def test_a_bundle_already_on_disk_is_never_overwritten(tmp_path: Path) -> None:
    """A daemon restarted within the second has no memory of the ids: the bundle directories say."""
    taken = unique_incident_id(1_796_000_000.0, "startup_stall", [], tmp_path / "diagnostics")
    (tmp_path / "diagnostics" / taken).mkdir(parents=True)
    assert unique_incident_id(1_796_000_000.0, "startup_stall", [], tmp_path / "diagnostics") == f"{taken}-2"


def test_memory_of_ids_is_bounded(tmp_path: Path) -> None:
    taken: list[str] = []
    for _ in range(250):
        unique_incident_id(1_796_000_000.0, "exited", taken, tmp_path)
    assert len(taken) == KEEP == 100
