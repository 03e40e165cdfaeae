"""The lifecycle has one owner and imports flow one way (STYLE 16), inside supervisor/daemon/:

    owner (one class, `Owner`, in one file) -> its parts by composition: server (one launch, which
      spawns, adopts, judges and stops), the group (supervisor.group), warm start (supervisor.warmstart)
      \\-> helpers: slate, stopping, evidence, xids, beating
      \\-> records: persist, adopt, publish, commands, snapshot, ...

A helper takes explicit values and returns an outcome: it never imports the owner (at run time or
for type checking), so it cannot call back into it, and only the owner imports the helpers that
act. Today's graph is read from the source, so a new import that breaks it fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PKG = ROOT / "supervisor" / "daemon"
OWNER = {"owner"}
# The helpers that act for the owner (spawn, stop, sweep, adopt, capture, drain Xids).
HELPERS = {"slate", "stopping", "evidence", "xids"}
# Small pieces the owner and its helpers share: a record of tools, the heartbeat wrapper.
SHARED = {"beating"}
# A helper may use another's record of tools (slate stops processes with `stopping.StopTools`).
HELPER_USES = {"slate": {"stopping"}, "server": {"stopping"}}
# Outside supervisor/daemon, only the composition root (root/serve; root/inprocess, the in-process
# face that starts it, names the type), the demo, tests and bench build it.
BUILDERS = {"supervisor/root/serve.py", "supervisor/root/inprocess.py", "supervisor/demo.py"}


def imported(path: Path) -> set[str]:
    """The supervisor.daemon modules `path` imports, at run time or for type checking."""
    tree = ast.parse(path.read_text())
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


def daemon_modules() -> list[str]:
    return sorted(p.stem for p in PKG.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("module", sorted(set(daemon_modules()) - OWNER))
def test_no_module_but_the_owner_imports_the_owner(module: str) -> None:
    """A helper that imported the owner could call back into it (the old actions -> Core.handle cycle)."""
    assert imported(PKG / f"{module}.py") & OWNER == set()


@pytest.mark.parametrize("module", sorted(set(daemon_modules()) - OWNER))
def test_only_the_owner_imports_the_helpers(module: str) -> None:
    assert imported(PKG / f"{module}.py") & HELPERS <= HELPER_USES.get(module, set())


def test_the_owner_is_one_class_composed_of_its_parts() -> None:
    """One class in one file (STYLE 10): the launch (`server`) is an object it holds."""
    assert imported(PKG / "owner.py") >= {"server"}
    tree = ast.parse((PKG / "owner.py").read_text())
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    assert [c.name for c in classes] == ["Owner"] and classes[0].bases == []


def test_the_owner_uses_the_helpers() -> None:
    used = set().union(*(imported(PKG / f"{m}.py") for m in OWNER))
    assert used >= HELPERS | SHARED


def test_nothing_outside_the_daemon_reaches_past_the_owner() -> None:
    """Elsewhere in the product, the owner is built only by the composition root and the demo."""
    for path in [*ROOT.glob("supervisor/**/*.py"), *ROOT.glob("api/**/*.py"), *ROOT.glob("probes/**/*.py")]:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("supervisor/daemon/"):
            continue
        uses = imported(path) & (OWNER | HELPERS)
        assert uses <= ({"owner"} if rel in BUILDERS else set()), f"{rel} imports {sorted(uses)}"


def test_the_removed_modules_stay_removed() -> None:
    """The six modules that each took the whole supervisor object are gone."""
    for old in ("core", "loop", "actions", "handlers", "upkeep", "guards", "handover"):
        assert not (PKG / f"{old}.py").exists()
    for old in ("owner_state", "owner_lifecycle", "owner_watch", "owner_group"):  # the owner spread by inheritance
        assert not (PKG / f"{old}.py").exists()
    # Rooms that only forwarded (issue 48): merged into the module whose rule they carried.
    for old in ("records", "counting", "incidentids", "xidbook", "launching", "takeover"):
        assert not (PKG / f"{old}.py").exists()
