"""Tests share helpers only through tests/support (and conftest fixtures): no test module imports
another, so moving or deleting a test never breaks its neighbours."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_no_test_module_imports_another() -> None:
    offenders = {
        str(path.relative_to(TESTS)): sorted(m for m in imported_modules(path) if m.split(".")[-1].startswith("test_"))
        for path in TESTS.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_support_modules_are_not_tests() -> None:
    assert not [p.name for p in (TESTS / "support").glob("test_*.py")]
