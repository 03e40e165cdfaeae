"""Imports flow one way (STYLE 16), between packages as well as inside the daemon: each package of the
product sits on a floor and imports only the floors below it, and no module imports itself back
through others. The graph is read from the source (imports inside functions and under
TYPE_CHECKING count), so a new import that runs back up or closes a circle fails here.

The figures the issue measures (imports that run back up, circles, modules in supervisor/daemon/)
are printed: `pytest -s tests/supervisor/test_import_floors.py`, or `make layers`, or run this file.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("supervisor", "api", "probes")

# Lowest first. A package imports only packages of lower floors; two packages of one floor do not
# import each other. `supervisor` alone is the package's __init__ (the version).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("supervisor.engines",),  # what differs per engine, as data: the probes read it
    # Leaves: the version, the clock, shared small modules, the read-only probes, and the simulator
    # (a program of its own that the composition root and the demo start).
    ("supervisor", "supervisor.clock", "supervisor.common", "probes", "supervisor.simulator"),
    ("supervisor.status",),  # the status contract: snapshot, commands, journal, names, timeline
    ("supervisor.config",),  # the one settings model
    ("supervisor.policy",),  # pure decisions
    ("supervisor.logs",),  # the server's output and the daemon's logging
    ("supervisor.process",),  # spawn, signal, stop: the one place that touches processes
    ("supervisor.diagnostics",),  # evidence
    # Notifications, the group, the process's OS plumbing, the Prometheus families, warm start.
    ("supervisor.alerting", "supervisor.group", "supervisor.host", "supervisor.metrics", "supervisor.warmstart"),
    ("supervisor.daemon",),  # the owner of the state and its helpers
    ("api",),  # routes over the status contract
    ("supervisor.root",),  # the composition root: builds the daemon and the API
    ("supervisor.checkconfig", "supervisor.client", "supervisor.demo"),  # verbs
    ("supervisor.cli",),
    ("supervisor.entry",),
    ("supervisor.__main__",),
)
FLOOR = {pkg: n for n, pkgs in enumerate(FLOORS) for pkg in pkgs}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports (`from a import b` names a.b when b is a module).
    Read once per process (the tests share it and never change it): parsing every module is most
    of this file's time."""
    known = modules()
    edges: dict[str, set[str]] = {}
    for mod, path in known.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    target = _resolve(f"{node.module}.{alias.name}", known)
                    if target is not None:
                        out.add(target)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    target = _resolve(alias.name, known)
                    if target is not None:
                        out.add(target)
        out.discard(mod)
        edges[mod] = out
    return edges


@functools.cache
def package(mod: str) -> str:
    """The floor's key: the longest FLOORS name that `mod` is or lies under."""
    best = ""
    for pkg in FLOOR:
        if (mod == pkg or mod.startswith(pkg + ".")) and len(pkg) > len(best):
            best = pkg
    return best if best != "supervisor" or mod == "supervisor" else mod


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a package to another on its own floor or above."""
    found = []
    for mod, targets in edges.items():
        for target in targets:
            a, b = package(mod), package(target)
            if a != b and FLOOR.get(b, -1) >= FLOOR.get(a, -1):  # no floor: test_every_package_has_a_floor
                found.append((mod, target))
    return sorted(found)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for mod, targets in edges.items():
        a = package(mod)
        packages.setdefault(a, set()).update(package(t) for t in targets if package(t) != a)
    return packages


def daemon_modules() -> list[str]:
    return sorted(p.stem for p in (ROOT / "supervisor" / "daemon").glob("*.py") if p.stem != "__init__")


def report() -> Iterator[str]:
    edges = graph()
    up, daemon = upward(edges), daemon_modules()
    yield f"imports that run back up: {len(up)}"
    yield from (f"  {a} -> {b}" for a, b in up)
    for kind, circ in (("modules", circles(edges)), ("packages", circles(package_graph(edges)))):
        yield f"circles of {kind}: {len(circ)}"
        yield from (f"  {' <-> '.join(c)}" for c in circ)
    yield f"modules in supervisor/daemon/: {len(daemon)} ({', '.join(daemon)})"


def test_every_package_has_a_floor() -> None:
    missing = sorted({package(m) for m in graph()} - set(FLOOR))
    assert missing == [], f"give these a floor in FLOORS: {missing}"


def test_no_import_runs_back_up() -> None:
    print("\n" + "\n".join(report()))
    assert upward(graph()) == []


def test_no_circles() -> None:
    edges = graph()
    assert circles(edges) == []
    assert circles(package_graph(edges)) == []


def test_only_the_composition_root_imports_the_api() -> None:
    users = sorted(
        m for m, targets in graph().items() if package(m) != "api" and any(package(t) == "api" for t in targets)
    )
    assert all(package(m) == "supervisor.root" for m in users), users


def test_the_status_contract_imports_nothing_else_of_the_daemon() -> None:
    for mod, targets in graph().items():
        if package(mod) == "supervisor.status":
            outside = {package(t) for t in targets} - {"supervisor.status", "supervisor.common", "probes"}
            assert outside == set(), f"{mod} imports {sorted(outside)}"


if __name__ == "__main__":  # pragma: no cover
    print("\n".join(report()))
