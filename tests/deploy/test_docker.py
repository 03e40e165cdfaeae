"""deploy/docker/Dockerfile: it parses (BuildKit's own parser, through the `dockerfile` package),
it runs the daemon as the manifests do, and what it copies builds the package. No docker here, so
the image itself is never built in the tests."""

from __future__ import annotations

import fnmatch
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import dockerfile
import pytest
from deploy_files import DAEMON_ARGV, DOCKERFILE, ROOT, one, pod_templates

KNOWN = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}  # fmt: skip


def commands() -> tuple[dockerfile.Command, ...]:
    parsed: tuple[dockerfile.Command, ...] = dockerfile.parse_file(str(DOCKERFILE))
    return parsed


def only(cmd: str) -> dockerfile.Command:
    (found,) = [c for c in commands() if c.cmd == cmd]
    return found


def copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY."""
    return [(list(c.value[:-1]), c.value[-1]) for c in commands() if c.cmd == "COPY"]


def test_every_instruction_is_known_and_the_base_is_sglang_0_5_16_by_its_full_name() -> None:
    parsed = commands()
    assert parsed and {c.cmd for c in parsed} <= KNOWN, {c.cmd for c in parsed} - KNOWN
    assert parsed[0].cmd == "ARG" and parsed[1].cmd == "FROM"
    name, _, default = parsed[0].value[0].partition("=")
    assert parsed[1].value == (f"${{{name}}}",)
    # A full name (registry/namespace/name:tag): podman and buildah refuse a short name without an alias.
    assert default == "docker.io/lmsysorg/sglang:v0.5.16"


def test_the_entry_point_is_the_daemon_with_the_manifests_config() -> None:
    entry, cmd = only("ENTRYPOINT"), only("CMD")
    assert entry.json and cmd.json, "exec form: the daemon is PID 1 and gets SIGTERM itself"
    assert [*entry.value, *cmd.value] == DAEMON_ARGV
    for role, template in pod_templates(one("LeaderWorkerSet")).items():
        (container,) = template["spec"]["containers"]
        assert container["command"] == DAEMON_ARGV, role
    assert only("STOPSIGNAL").value == ("SIGTERM",)


def _shell_steps() -> list[list[str]]:
    """Each `&&` step of every RUN, as words."""
    return [shlex.split(step) for c in commands() if c.cmd == "RUN" for step in c.value[0].split("&&")]


def test_it_installs_the_package_py_spy_and_gdb() -> None:
    steps = _shell_steps()
    (apt,) = [s for s in steps if s[:2] == ["apt-get", "install"]]
    assert "gdb" in apt
    (pip,) = [s for s in steps if "pip" in s and "install" in s]
    assert {"/opt/sglang-supervisor/src", "py-spy"} <= set(pip)
    venv_python = pip[pip.index("--python") + 1]
    venv_bin = str(Path(venv_python).parent)
    linked = {s[3]: s[2] for s in steps if s[:2] == ["ln", "-s"]}
    for tool in ("sglang-supervisor", "py-spy", "pystack"):  # on PATH; `python3` stays the image's
        assert linked[f"/usr/local/bin/{tool}"] == f"{venv_bin}/{tool}", tool
    assert "/usr/local/bin/python3" not in linked
    assert set(only("EXPOSE").value) == {"8900", "30000"}


def test_what_it_copies_exists_and_the_dockerignore_lets_it_through() -> None:
    ignore = [
        line.strip()
        for line in DOCKERFILE.with_name("Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = [s for srcs, _dest in copies() for s in srcs]
    assert {"pyproject.toml", "README.md", "LICENSE", "supervisor", "api", "probes"} <= set(sources)
    for src in sources:
        assert (ROOT / src).exists(), src
        # The last matching pattern decides (as .dockerignore does): each source must end included.
        included = True
        for pattern in ignore:
            negated = pattern.startswith("!")
            if fnmatch.fnmatch(src, pattern.lstrip("!").rstrip("/")):
                included = negated
        assert included, src
    assert not any(fnmatch.fnmatch("tests", p) and p.startswith("!") for p in ignore)


@pytest.mark.integration
def test_the_copied_sources_build_the_package_with_its_entry_point(tmp_path: Path) -> None:
    """Lay out the build context as the COPY lines do, and build the wheel pip would install."""
    for srcs, dest in copies():
        target = tmp_path / dest.removeprefix("/")
        for src in srcs:
            source = ROOT / src
            if source.is_dir():  # Docker copies a directory's contents into the destination
                shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:  # a file into a destination that ends in "/" keeps its name
                into = target / source.name if dest.endswith("/") else target
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(source, into)
    src_dir = tmp_path / "opt" / "sglang-supervisor" / "src"
    out = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src_dir)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("sglang_supervisor-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "sglang-supervisor = supervisor.entry:main" in zf.read(entry_points).decode()
    assert {"api/app.py", "api/routes/probes.py", "api/readiness.py"} <= names
    assert not any(n.startswith("tests/") for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the image's package carries its LICENSE"
    assert "api/testing.py" not in names  # test code does not ship
