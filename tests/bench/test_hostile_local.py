"""Issue 50's hostile rows from beside the daemon (bench/hostile_local.py) are wired into the hostile
benchmark, render without a daemon to watch, and their figures can fail: a downloader that trusts the
names and follows the redirect, as the CLI did before the fix, is counted."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest


@pytest.fixture
def local(hostile: ModuleType) -> ModuleType:
    return importlib.import_module("bench.hostile_local")


def test_the_local_attacks_are_attacks_that_only_selects(hostile: ModuleType, local: ModuleType) -> None:
    assert local.LOCAL_ATTACKS == ("bundles_get_traversal", "state_file_nan", "cookie_other_port")
    assert hostile.ATTACKS[-len(local.LOCAL_ATTACKS) :] == local.LOCAL_ATTACKS


def test_a_row_without_a_daemon_to_watch_renders_dashes(hostile: ModuleType) -> None:
    summary = {"livez_ok": 3, "livez_failed": 0, "livez_p50_ms": 1.0, "livez_p99_ms": 2.0}
    summary |= {"rss_peak_mb": 70.0, "fds_peak": 9}
    rows = hostile.rows_of(
        [
            {"attack": "bundles_get_traversal", "rest": None, "attack_figures": None, "after": None, "extra": {"x": 0}},
            {"attack": "state_file_nan", "rest": None, "attack_figures": summary, "after": None, "extra": {}},
        ]
    )
    assert rows[0][1:6] == ["- / - / -", "- / - / -", "- / -", "- / -", "-"] and rows[0][6] == "x 0"
    assert rows[1][1] == "- / 70 / -" and rows[1][5] == "0 of 3"


def test_the_real_cli_writes_nothing_outside_and_sends_the_token_nowhere_else(
    local: ModuleType, tmp_path: Path
) -> None:
    got = local.bundles_get_traversal(tmp_path)
    assert got["written_outside_id"] == 0 and got["token_to_other_port"] == 0, got
    assert got["cli_exit"] == "1/1/1/1", got  # each lie refused, with a message


def test_a_downloader_that_trusts_the_wire_is_counted(
    local: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The figures can fail: the old behaviour (names joined to ./ID, redirects followed with the token,
    the planted link followed) shows up in them."""

    def naive(cwd: Path, url: str, bundle: str) -> Any:
        headers = {"Authorization": f"Bearer {local.CLI_TOKEN}"}
        names = httpx.get(f"{url}/diagnostics/{bundle}", headers=headers).json()["files"]
        where = cwd / bundle
        if not where.is_symlink():
            where.mkdir(exist_ok=True)
        for name in names:
            r = httpx.get(f"{url}/diagnostics/{bundle}/{name}", headers=headers)
            if r.is_redirect:  # httpx drops Authorization across origins; the old client re-sent it
                r = httpx.get(r.headers["location"], headers=headers)
            target = where / name
            if where.is_symlink():
                where.resolve().mkdir(parents=True, exist_ok=True)
            target.resolve().parent.mkdir(parents=True, exist_ok=True)
            target.resolve().write_bytes(r.content)
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(local, "_cli", naive)
    got = local.bundles_get_traversal(tmp_path)
    assert got["written_outside_id"] >= 3 and got["token_to_other_port"] >= 1, got


def test_poison_replaces_every_learned_quiet_interval(local: ModuleType, tmp_path: Path) -> None:
    book = tmp_path / "launches.json"
    book.write_text(json.dumps({"version": 1, "entries": {"k": {"starts": 2, "quiet_s": {"a": 1.0, "b": 2.0}}}}))
    assert local.poison(book) == 2
    assert "NaN" in book.read_text() and "Infinity" in book.read_text()
