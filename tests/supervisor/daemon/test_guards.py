from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from supervisor.daemon.guards import unique_incident_id


def fake_core(tmp_path: Path, wall: float) -> Any:
    return SimpleNamespace(
        clock=SimpleNamespace(wall=lambda: wall),
        settings=SimpleNamespace(state_dir=tmp_path),
        incident_ids=[],
    )


def test_ids_in_one_second_get_suffixes(tmp_path: Path) -> None:
    core = fake_core(tmp_path, 1_796_000_000.2)
    first = unique_incident_id(core, "exited")
    core.clock = SimpleNamespace(wall=lambda: 1_796_000_000.48)  # 0.28 s later, the same second
    second = unique_incident_id(core, "exited")
    third = unique_incident_id(core, "exited")
    assert second == f"{first}-2" and third == f"{first}-3"
    assert unique_incident_id(core, "manual") != first  # another cause: its own id


def test_a_bundle_already_on_disk_is_never_overwritten(tmp_path: Path) -> None:
    """A daemon restarted within the second has no memory of the ids: the bundle directories say."""
    core = fake_core(tmp_path, 1_796_000_000.0)
    taken = unique_incident_id(fake_core(tmp_path, 1_796_000_000.0), "startup_stall")
    (tmp_path / "diagnostics" / taken).mkdir(parents=True)
    assert unique_incident_id(core, "startup_stall") == f"{taken}-2"


def test_memory_of_ids_is_bounded(tmp_path: Path) -> None:
    core = fake_core(tmp_path, 1_796_000_000.0)
    for _ in range(250):
        unique_incident_id(core, "exited")
    assert len(core.incident_ids) == 100
