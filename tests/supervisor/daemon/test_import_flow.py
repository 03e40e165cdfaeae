"""The lifecycle has one owner and imports flow one way (STYLE 16), inside supervisor/daemon/:
loop -> handlers -> upkeep -> actions -> guards -> core, actions -> stopping -> core, and
handover -> core."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[3] / "supervisor" / "daemon"
# module -> the lifecycle modules it must never import (at run time or for type checking)
FORBIDDEN = {
    "core": {"loop", "handlers", "upkeep", "actions", "guards", "stopping", "handover"},
    "guards": {"loop", "handlers", "upkeep", "actions", "handover"},
    "actions": {"loop", "handlers", "upkeep", "handover"},
    "stopping": {"loop", "handlers", "upkeep", "actions", "guards", "handover"},
    "handover": {"loop", "handlers", "upkeep", "actions"},
    "upkeep": {"loop", "handlers"},
    "handlers": {"loop"},
}


def imported(module: str) -> set[str]:
    tree = ast.parse((PKG / f"{module}.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == "supervisor.daemon":
                names |= {a.name for a in node.names}
            elif node.module.startswith("supervisor.daemon."):
                names.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[2] for a in node.names if a.name.startswith("supervisor.daemon.")}
    return names


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_no_import_goes_back_up_the_flow(module: str) -> None:
    assert imported(module) & FORBIDDEN[module] == set()


def test_the_owner_uses_the_helpers() -> None:
    assert {"actions", "handlers", "handover", "core"} <= imported("loop")
