"""Fixtures of the bench modules' tests: the benches import as `python -m bench.X` does, from the
repository root."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hostile(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT))  # `python -m bench.hostile` runs from the repository root
    return importlib.import_module("bench.hostile")
