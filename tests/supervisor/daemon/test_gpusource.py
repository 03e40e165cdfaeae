"""The composition root hands the GPU probes the NVML `[gpu]` names; nothing else picks one."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from probes.gpu import GpuProbe, load_pynvml
from supervisor.config.gpu import GpuSettings
from supervisor.root.gpusource import open_nvml
from supervisor.simulator.gpu import SimulatedNvml

ROOT = Path(__file__).resolve().parents[3]


def test_nvml_is_the_default_and_the_environment_cannot_change_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"devices": [{}]}))
    for name in ("SGLANG_SUPERVISOR_FAKE_NVML", "SGLANG_SIM_GPU_FILE"):
        monkeypatch.setenv(name, str(path))
    got = open_nvml(GpuSettings())
    assert got is load_pynvml() and not isinstance(got, SimulatedNvml)


def test_the_simulator_source_reads_its_file(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"devices": [{"uuid": "GPU-sim", "util": 40}]}))
    nvml = open_nvml(GpuSettings(source="simulator", file=str(path)))
    assert isinstance(nvml, SimulatedNvml) and nvml.path == path
    assert nvml is not open_nvml(GpuSettings(source="simulator", file=str(path)))  # one per probe
    obs = GpuProbe(nvml).observe([])
    assert [(d.uuid, d.util_percent) for d in obs.devices] == [("GPU-sim", 40.0)]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_only_the_composition_root_imports_the_simulated_gpu() -> None:
    """Probes take an NVML object; outside the simulator only the composition root opens the
    simulated GPU, and the demo (which simulates a server) writes its file."""
    users = []
    for pkg in ("probes", "api", "supervisor"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("supervisor/simulator/"):
                continue
            if any(m.startswith("supervisor.simulator.gpu") for m in _imports(path)):
                users.append(rel)
    assert users == ["supervisor/demo.py", "supervisor/root/gpusource.py"]


def test_no_product_module_reads_a_fake_nvml_variable_or_ships_a_test_fake() -> None:
    for pkg in ("probes", "api", "supervisor"):
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            assert "FAKE_NVML" not in text, path
            assert "class FakeClock" not in text and "class FakeNvml" not in text, path
    assert not list((ROOT / "probes").glob("fake_*.py"))
