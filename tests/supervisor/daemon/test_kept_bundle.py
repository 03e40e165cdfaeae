"""One bundle per node for one group incident: asked again, a node answers with the one it wrote."""

from __future__ import annotations

from pathlib import Path

from supervisor.daemon.evidence import kept_bundle


def test_no_bundle_under_that_id_is_none_and_a_half_written_one_does_not_count(tmp_path: Path) -> None:
    assert kept_bundle(tmp_path, "i1") is None
    (tmp_path / ".tmp-i1").mkdir()  # a write cut by a crash: not a bundle
    assert kept_bundle(tmp_path, "i1") is None


def test_a_written_bundle_gives_its_summary_and_an_unreadable_one_an_empty_one(tmp_path: Path) -> None:
    (tmp_path / "i1").mkdir()
    (tmp_path / "i1" / "summary.json").write_text('{"hang_class": "unknown", "group": {"node": 1}}')
    assert kept_bundle(tmp_path, "i1") == {"hang_class": "unknown", "group": {"node": 1}}
    (tmp_path / "i2").mkdir()
    (tmp_path / "i2" / "summary.json").write_text("[1, 2")
    assert kept_bundle(tmp_path, "i2") == {}
    (tmp_path / "i3").mkdir()
    assert kept_bundle(tmp_path, "i3") == {}
