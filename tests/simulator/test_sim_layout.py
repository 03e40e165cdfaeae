"""The simulator by engine (docs/DECISIONS.md, "The simulator by engine"): SGLang's modules in
`supervisor/simulator/sglang/`, vLLM's in `supervisor/simulator/vllm/`, the simulated GPU in `gpu/`,
the frames py-spy shows in `mirror/`, and what both engines use beside them. Read from the source
(imports inside functions count): a shared module that reaches into one engine, or an engine that
reaches into the other, fails here, as does a flat `vllm_*` module coming back."""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "supervisor" / "simulator"
ENGINES = ("sglang", "vllm")
ENTRY = "__main__"  # `python -m supervisor.simulator`: picks the engine, so it may start either


def _imports(path: Path) -> set[str]:
    """The supervisor.simulator.* names a module imports (`from a import b` gives a.b as well)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return {n for n in names if n.startswith("supervisor.simulator.")}


def _engine_of(name: str) -> str | None:
    part = name.removeprefix("supervisor.simulator.").split(".", 1)[0]
    return part if part in ENGINES else None


def _home(path: Path) -> str:
    """Where a module of the simulator lives: an engine, gpu, mirror or the shared top level."""
    first = path.relative_to(SIM).parts[0]
    return first if first in (*ENGINES, "gpu", "mirror") else "shared"


def test_the_engines_are_packages_and_no_flat_engine_module_is_left() -> None:
    for engine in ENGINES:
        assert (SIM / engine / "__init__.py").is_file(), engine
        assert len(list((SIM / engine).glob("*.py"))) > 5, engine
    assert sorted(p.name for p in SIM.glob("vllm_*.py")) == []
    assert not (SIM / "server.py").exists() and not (SIM / "scheduler.py").exists()  # SGLang's, in sglang/


def test_shared_parts_reach_into_no_engine_and_no_engine_into_the_other() -> None:
    wrong = []
    for path in sorted(SIM.rglob("*.py")):
        home = _home(path)
        for name in sorted(_imports(path)):
            engine = _engine_of(name)
            if engine is None or engine == home or (home == "shared" and path.stem == ENTRY):
                continue
            wrong.append(f"{path.relative_to(SIM)} ({home}) imports {name}")
    assert wrong == []


def test_the_gpu_and_the_mirror_import_nothing_else_of_the_simulator() -> None:
    """The daemon's composition root opens gpu/ (a leaf), and mirror/ names frames only."""
    for home in ("gpu", "mirror"):
        for path in sorted((SIM / home).rglob("*.py")):
            outside = {n for n in _imports(path) if not n.startswith(f"supervisor.simulator.{home}")}
            assert outside == set(), f"{path.relative_to(SIM)} imports {sorted(outside)}"
