"""The vLLM device bundle's part splitting, on small fake files: units, exact compressed sizes, first-fit
packing under the limit, parts that each unpack alone (with xz's concatenated streams), the manifest the
device script checks, and the refusal of a unit that can never fit. No download, no vLLM."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from bench.real import vllm_bundle as vb
from bench.real.build_bundle import read_packages

ROOT = Path(__file__).resolve().parents[2]


def _noise(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)  # incompressible: its xz size is about its own size


def _stage(tmp: Path) -> Path:
    stage = tmp / "stage"
    files = {
        "site/pkg/big_a.so": _noise(30_000, 1),
        "site/pkg/big_b.so": _noise(24_000, 2),
        "site/pkg/sub/mod1.py": b"x = 1\n" * 500,
        "site/pkg/sub/mod2.py": _noise(9_000, 3),
        "site/pkg/__init__.py": b"",
        "site/other/data.bin": _noise(12_000, 4),
        "site/top.py": b"print('hi')\n",
        "site/pkg-1.0.dist-info/METADATA": b"Name: pkg\nVersion: 1.0\nRequires-Dist: other>=2\n",
    }
    for rel, data in files.items():
        path = stage / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (stage / "site/pkg/big_a.so").chmod(0o755)
    return stage


def _build(tmp: Path, limit: int, cache: Path | None = None) -> tuple[Path, list[Path], list[list[vb.Unit]]]:
    stage = _stage(tmp)
    units = vb.make_units(stage, big_file=20_000, group_raw=10_000)
    vb.compress_units(stage, units, cache, workers=2)
    bins = vb.pack(units, limit)
    return stage, vb.write_parts(bins, tmp / "out", limit), bins


def test_units_put_big_files_alone_and_group_the_rest_by_directory(tmp_path: Path) -> None:
    stage = _stage(tmp_path)
    units = vb.make_units(stage, big_file=20_000, group_raw=10_000)
    by_name = {u.name: u.files for u in units}
    assert by_name["site/pkg/big_a.so"] == ["site/pkg/big_a.so"]
    assert by_name["site/pkg/big_b.so"] == ["site/pkg/big_b.so"]
    # site/pkg/sub holds 12 KB of small files: two chunks of at most 10 KB
    sub = [u for u in units if u.name.startswith("site/pkg/sub/")]
    assert sorted(f for u in sub for f in u.files) == ["site/pkg/sub/mod1.py", "site/pkg/sub/mod2.py"]
    assert len(sub) == 2
    every = sorted(f for u in units for f in u.files)
    assert every == sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file())


@pytest.mark.integration  # builds xz parts
def test_parts_stay_under_the_limit_and_unpack_alone_to_the_same_files(tmp_path: Path) -> None:
    limit = 45_000
    stage, parts, bins = _build(tmp_path, limit)
    assert len(parts) >= 2  # 75 KB of noise cannot fit one 45 KB part
    assert [p.name for p in parts] == [f"vllm-part{k}.tar.xz" for k in range(1, len(parts) + 1)]
    for path, units in zip(parts, bins, strict=True):
        assert path.stat().st_size <= limit
        # exact: a part is its units' xz streams plus a small trailer stream
        assert sum(u.size for u in units) < path.stat().st_size <= sum(u.size for u in units) + vb.TRAILER_ROOM
    out = tmp_path / "unpacked"
    builds = set()
    for k, path in enumerate(parts, 1):
        with tarfile.open(path, "r:xz") as tar:  # each part is a whole archive on its own
            names = tar.getnames()
            assert f"manifest/part{k}.json" in names
            tar.extractall(out, filter="data")
        manifest = json.loads((out / f"manifest/part{k}.json").read_text())
        assert (manifest["part"], manifest["parts"]) == (k, len(parts))
        assert manifest["files"] == len(names) - 1
        builds.add(manifest["build"])
    assert len(builds) == 1
    for src in (stage / "site").rglob("*"):
        if src.is_file():
            copy = out / src.relative_to(stage)
            assert copy.read_bytes() == src.read_bytes(), src
    assert os.access(out / "site/pkg/big_a.so", os.X_OK)
    assert not os.access(out / "site/top.py", os.X_OK)


@pytest.mark.integration  # builds xz parts, runs tar
@pytest.mark.skipif(not (shutil.which("tar") and shutil.which("xz")), reason="needs GNU tar and xz")
def test_gnu_tar_reads_the_concatenated_streams(tmp_path: Path) -> None:
    _, parts, _ = _build(tmp_path, 45_000)
    dest = tmp_path / "tar"
    dest.mkdir()
    for path in parts:
        subprocess.run(["tar", "-xJf", str(path), "-C", str(dest)], check=True)
    assert (dest / "site/pkg/big_b.so").stat().st_size == 24_000
    assert len(list((dest / "manifest").glob("part*.json"))) == len(parts)


def test_a_unit_larger_than_a_part_fails_with_its_name_and_size(tmp_path: Path) -> None:
    stage = _stage(tmp_path)
    units = vb.make_units(stage, big_file=20_000, group_raw=10_000)
    vb.compress_units(stage, units, None, workers=1)
    with pytest.raises(vb.PartTooLarge, match=r"site/pkg/big_a\.so 30\d\d\d bytes compressed"):
        vb.pack(units, 28_000)


def test_a_written_part_over_the_limit_is_refused(tmp_path: Path) -> None:
    unit = vb.Unit("u", ["site/u"], 10, b"\0" * 5_000)
    with pytest.raises(vb.PartTooLarge, match="over the"):
        vb.write_parts([[unit]], tmp_path, limit=5_000)


@pytest.mark.integration  # builds xz parts twice
def test_rebuilding_reuses_the_cache_and_replaces_stale_parts(tmp_path: Path) -> None:
    cache = tmp_path / "xz"
    _, parts, _ = _build(tmp_path / "a", 45_000, cache)
    first = [p.read_bytes() for p in parts]
    stale = tmp_path / "a" / "out" / "vllm-part9.tar.xz"
    stale.write_bytes(b"old")
    stage = _stage(tmp_path / "b")
    units = vb.make_units(stage, big_file=20_000, group_raw=10_000)
    assert vb.compress_units(stage, units, cache, workers=2) == len(units)  # every unit from the cache
    again = vb.write_parts(vb.pack(units, 45_000), tmp_path / "a" / "out", 45_000)
    assert not stale.exists()
    assert [p.read_bytes() for p in again] == first  # same content, same parts, byte for byte


@pytest.mark.integration  # builds xz parts, runs the script
def test_the_device_script_refuses_an_incomplete_set_of_parts(tmp_path: Path) -> None:
    _, parts, _ = _build(tmp_path, 45_000)
    env = {**os.environ, "VLLM": str(tmp_path / "dev")}
    script = ROOT / "bench/real/vllm_device.sh"
    first = subprocess.run(["sh", str(script), "part", str(parts[0]), "check"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert first.returncode == 1
    assert "missing [2" in first.stdout + first.stderr
    assert (tmp_path / "dev/site").is_dir()


def test_unmet_requirements_name_what_neither_the_bundle_nor_the_device_has(tmp_path: Path) -> None:
    stage = _stage(tmp_path)
    assert vb.unmet_requirements(stage / "site", ["other==1.5"]) == {"pkg": ["other>=2 (have 1.5)"]}
    assert vb.unmet_requirements(stage / "site", ["other==2.1"]) == {}
    assert vb.unmet_requirements(stage / "site", []) == {"pkg": ["other>=2"]}


def test_the_package_list_says_why_and_trims_what_an_h200_never_loads() -> None:
    pkgs = {p.name: p for p in read_packages(vb.PACKAGES)}
    assert pkgs["vllm"].version == "0.26.0"
    assert pkgs["apache-tvm-ffi"].version == "0.1.10"
    assert {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so", "vllm/vllm-rs"} <= set(
        pkgs["vllm"].trim)
    assert all(p.why for p in pkgs.values())
    assert vb.PART_LIMIT <= 58_000_000
