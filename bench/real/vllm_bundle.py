"""Build the device bundle for real vLLM 0.26.0: independent tar.xz parts, each small enough for one
device call.

Run on a CPU machine that reaches the package index (any Python 3.10+):

    python3 -m bench.real.vllm_bundle             # writes .real/vllm-part1.tar.xz ... partN (git-ignored)

The list, with the reason each package travels and what is trimmed, is `bench/real/vllm_packages.toml`.
The wheels are downloaded, unzipped and trimmed with `bench/real/build_bundle.py`'s functions. Each
part is a complete tar.xz holding `site/...` files and `manifest/partK.json`, so it can be unpacked
the moment it arrives: the GPU machine keeps /tmp only about 30 s between calls, so the parts go in
calls made back to back (`bench/real/vllm_device.sh`, docs/VLLM.md "What carrying it takes").

How parts are cut: the site's files are grouped into units (a file of 1 MB or more alone; smaller files
by their first two path components, in chunks of at most 32 MB), each unit is written as tar members
and compressed once as its own xz stream (cached by content under the cache directory), and the
units are packed first-fit-decreasing into parts by their exact compressed sizes. A part's file is
its units' xz streams one after another, then a stream holding its manifest and the tar end marker:
xz and Python's lzma read concatenated streams as one, so `tar -xJf` unpacks it as one archive.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from bench.real.build_bundle import PLATFORMS, ROOT, _size, download, read_packages, trim, unpack

HERE = Path(__file__).resolve().parent
PACKAGES = HERE / "vllm_packages.toml"
# llguidance 1.7 ships manylinux_2_31 wheels only; the device's Python 3.12.3 is Ubuntu 24.04's (glibc 2.39)
VLLM_PLATFORMS = ("manylinux_2_31_x86_64", *PLATFORMS)
PART_LIMIT = 58_000_000  # one device call carries 64 MiB, the working tree (~5 MB) included
BIG_FILE = 1_000_000  # a file this large is a unit of its own
GROUP_RAW = 32_000_000  # small files are grouped in chunks of at most this many raw bytes
MTIME = 1_767_225_600  # 2026-01-01: fixed, so a unit's bytes (and its cache key) depend on content only
PRESET = 7
END_MARKER = b"\0" * (2 * tarfile.BLOCKSIZE)


class PartTooLarge(SystemExit):
    pass


@dataclass
class Unit:
    name: str
    files: list[str]  # paths relative to the stage directory (site/...)
    raw: int = 0
    xz: bytes = b""
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.xz)


def make_units(stage: Path, big_file: int = BIG_FILE, group_raw: int = GROUP_RAW) -> list[Unit]:
    """Group the files under stage into units: big files alone, small ones by their first two path parts."""
    files = sorted(p for p in stage.rglob("*") if p.is_file() or p.is_symlink())
    units: list[Unit] = []
    groups: dict[str, list[tuple[str, int]]] = {}
    for p in files:
        rel = p.relative_to(stage).as_posix()
        size = p.stat().st_size
        if size >= big_file:
            units.append(Unit(rel, [rel], size))
            continue
        parts = rel.split("/")
        key = "/".join(parts[:3]) if len(parts) > 3 else "/".join(parts[:-1]) or parts[0]
        groups.setdefault(key, []).append((rel, size))
    for key, members in sorted(groups.items()):
        chunk: list[str] = []
        raw = 0
        n = 0
        for rel, size in members:
            if chunk and raw + size > group_raw:
                units.append(Unit(f"{key}/ ({n})", chunk, raw))
                chunk, raw, n = [], 0, n + 1
            chunk.append(rel)
            raw += size
        if chunk:
            units.append(Unit(f"{key}/" + (f" ({n})" if n else ""), chunk, raw))
    return units


def tar_members(stage: Path, files: list[str]) -> bytes:
    """The tar members (PAX headers and data) for files, without the end marker: deterministic bytes."""
    out = io.BytesIO()
    for rel in files:
        path = stage / rel
        data = path.read_bytes()
        info = tarfile.TarInfo(rel)
        info.size = len(data)
        info.mtime = MTIME
        info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        out.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        out.write(data)
        pad = -len(data) % tarfile.BLOCKSIZE
        out.write(b"\0" * pad)
    return out.getvalue()


def xz(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=PRESET)


def compress_units(stage: Path, units: list[Unit], cache: Path | None, workers: int | None = None) -> int:
    """Fill each unit's xz stream, from the cache where its content was compressed before. Returns cache hits."""
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    hits = 0

    def one(unit: Unit) -> bool:
        data = tar_members(stage, unit.files)
        key = hashlib.sha256(data).hexdigest()
        cached = cache / f"{key}.xz" if cache is not None else None
        if cached is not None and cached.exists():
            unit.xz = cached.read_bytes()
            return True
        unit.xz = xz(data)
        if cached is not None:
            tmp = cached.with_suffix(".tmp")
            tmp.write_bytes(unit.xz)
            tmp.replace(cached)
        return False

    # lzma releases the GIL while it compresses: threads use every core without copying the data.
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
        for hit in pool.map(one, sorted(units, key=lambda u: -u.raw)):
            hits += hit
    return hits


def _trailer(part: int, parts: int, build: str, units: list[Unit]) -> bytes:
    manifest = {
        "build": build,
        "part": part,
        "parts": parts,
        "files": sum(len(u.files) for u in units),
        "raw_bytes": sum(u.raw for u in units),
        "units": [u.name for u in units],
    }
    data = json.dumps(manifest, indent=1).encode()
    info = tarfile.TarInfo(f"manifest/part{part}.json")
    info.size, info.mtime, info.mode = len(data), MTIME, 0o644
    pad = b"\0" * (-len(data) % tarfile.BLOCKSIZE)
    member = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data + pad
    return xz(member + END_MARKER)


TRAILER_ROOM = 4096  # a part's manifest and end marker, compressed, stay far below this


def pack(units: list[Unit], limit: int) -> list[list[Unit]]:
    """First-fit decreasing by compressed size; a unit that cannot fit any part fails with its size."""
    capacity = limit - TRAILER_ROOM
    too_big = [u for u in units if u.size > capacity]
    if too_big:
        lines = ", ".join(f"{u.name} {u.size} bytes compressed" for u in too_big)
        raise PartTooLarge(f"cannot fit in a part of {limit} bytes ({limit / 1e6:.1f} MB) even alone: {lines}; "
                           f"trim it in vllm_packages.toml or raise --limit-mb if the device call has room")
    bins: list[list[Unit]] = []
    room: list[int] = []
    for u in sorted(units, key=lambda u: (-u.size, u.name)):
        for i, free in enumerate(room):
            if u.size <= free:
                bins[i].append(u)
                room[i] -= u.size
                break
        else:
            bins.append([u])
            room.append(capacity - u.size)
    return bins


def write_parts(bins: list[list[Unit]], out_dir: Path, limit: int, prefix: str = "vllm-part") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(f"{prefix}*.tar.xz"):
        old.unlink()
    build = hashlib.sha256(b"".join(hashlib.sha256(u.xz).digest() for b in bins for u in b)).hexdigest()[:12]
    paths = []
    for k, units in enumerate(bins, 1):
        path = out_dir / f"{prefix}{k}.tar.xz"
        with open(path, "wb") as f:
            for u in sorted(units, key=lambda u: u.name):
                f.write(u.xz)
            f.write(_trailer(k, len(bins), build, units))
        size = path.stat().st_size
        if size > limit:
            raise PartTooLarge(f"{path} is {size} bytes, over the limit of {limit} bytes ({limit / 1e6:.1f} MB)")
        paths.append(path)
    return paths


def stage_site(cache: Path) -> tuple[Path, int, dict[str, int]]:
    """Download, unzip and trim the packages into cache/vllm-stage/site. Returns (stage, trimmed bytes, wheel sizes)."""
    pkgs = read_packages(PACKAGES)
    wheels = download(pkgs, cache, VLLM_PLATFORMS)
    stage = cache / "vllm-stage"
    shutil.rmtree(stage, ignore_errors=True)
    site, bindir = stage / "site", cache / "vllm-stage-bin"
    shutil.rmtree(bindir, ignore_errors=True)
    bindir.mkdir(parents=True)
    for w in wheels:
        unpack(w, site, bindir)
    shutil.rmtree(bindir)  # console scripts: vLLM is started as python3 -m vllm.entrypoints.openai.api_server
    trimmed = sum(trim(site, p.trim) for p in pkgs)
    for cache_dir in site.rglob("__pycache__"):
        shutil.rmtree(cache_dir, ignore_errors=True)
    return stage, trimmed, {w.name: w.stat().st_size for w in wheels}


def unmet_requirements(site: Path, device: list[str]) -> dict[str, list[str]]:
    """Requires-Dist of each carried distribution (Python 3.12, Linux x86_64, no extras) that neither the
    carried set nor the device's pip list satisfies: {distribution: [requirement, ...]}."""
    from email.parser import Parser

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    have: dict[str, str] = {}
    for line in device:
        name, _, version = line.partition("==")
        have[canonicalize_name(name)] = version
    metas = {}
    for meta in sorted(site.glob("*.dist-info/METADATA")):
        msg = Parser().parsestr(meta.read_text(errors="replace"))
        have[canonicalize_name(msg["Name"])] = msg["Version"]  # carried shadows the device's
        metas[msg["Name"]] = msg.get_all("Requires-Dist") or []
    unmet: dict[str, list[str]] = {}
    for name, reqs in metas.items():
        for text in reqs:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            got = have.get(canonicalize_name(req.name))
            if got is None or (req.specifier and not req.specifier.contains(got, prereleases=True)):
                unmet.setdefault(name, []).append(f"{req.name}{req.specifier}" + (f" (have {got})" if got else ""))
    return unmet


def build(out_dir: Path, cache: Path, limit: int = PART_LIMIT) -> list[Path]:
    t0 = time.monotonic()
    stage, trimmed, wheel_sizes = stage_site(cache)
    t1 = time.monotonic()
    units = make_units(stage)
    hits = compress_units(stage, units, cache / "xz")
    t2 = time.monotonic()
    bins = pack(units, limit)
    paths = write_parts(bins, out_dir, limit)
    t3 = time.monotonic()
    raw = _size(stage)
    device = tomllib.loads(PACKAGES.read_text()).get("device_pip_list", [])
    try:
        unmet = unmet_requirements(stage / "site", device)
    except ImportError:  # packaging missing: the report is information, not a gate
        unmet = {}
    for name, reqs in sorted(unmet.items()):
        print(f"  not carried, not on the device (lazy or guarded, see vllm_packages.toml): {name} wants "
              + ", ".join(reqs))
    print(f"{len(wheel_sizes)} wheels {sum(wheel_sizes.values()) / 1e6:.1f} MB; unpacked {raw / 1e6:.1f} MB "
          f"after trimming {trimmed / 1e6:.1f} MB; {len(units)} units ({hits} from the cache)")
    for path, b in zip(paths, bins, strict=True):
        top = ", ".join(f"{u.name} {u.size / 1e6:.1f}" for u in sorted(b, key=lambda u: -u.size)[:3])
        print(f"  {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}  {path.stat().st_size / 1e6:6.1f} MB"
              f"  ({len(b)} units, {sum(u.raw for u in b) / 1e6:.0f} MB raw; largest: {top})")
    total = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} parts, {total / 1e6:.1f} MB in all (limit {limit / 1e6:.1f} MB a part); "
          f"stage {t1 - t0:.0f} s, compress {t2 - t1:.0f} s, write {t3 - t2:.0f} s, total {t3 - t0:.0f} s")
    return paths


# What `--check-imports` imports on the GPU machine: the API server and every module the engine core
# reaches for a dense Llama with an EAGLE-3 draft on CUDA (both model runners, FA3, FlashInfer's sampler).
CHECK_MODULES = (
    "vllm", "vllm.entrypoints.openai.api_server", "vllm.platforms.cuda", "vllm.v1.engine.core",
    "vllm.v1.engine.async_llm", "vllm.v1.executor.uniproc_executor", "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.models.llama", "vllm.model_executor.models.llama_eagle3",
    "vllm.model_executor.model_loader.default_loader", "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.attention.backends.flashinfer", "vllm.vllm_flash_attn", "vllm.v1.spec_decode.eagle",
    "vllm.v1.worker.gpu.spec_decode.eagle.speculator", "vllm.v1.worker.gpu.sample.sampler",
    "vllm.v1.sample.sampler", "vllm.v1.sample.rejection_sampler", "vllm.v1.core.sched.scheduler",
    "vllm.model_executor.warmup.kernel_warmup", "vllm.compilation.backends", "vllm.v1.structured_output",
    "vllm.entrypoints.serve.instrumentator.metrics", "vllm.entrypoints.generate.api_router",
    "flashinfer.sampling", "setproctitle",
)


def check_imports(modules: tuple[str, ...] = CHECK_MODULES) -> int:
    """Import each module and print what failed and which modules were missing. Returns the failures."""
    import importlib
    import traceback

    failed: dict[str, str] = {}
    missing: set[str] = set()
    t0 = time.monotonic()
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:  # a native import can raise anything: report it all
            why = f"{type(e).__name__}: {e}"
            if why not in failed.values():  # one traceback per distinct error
                traceback.print_exc(limit=-3)
            failed[name] = why
            if isinstance(e, ModuleNotFoundError) and e.name:
                missing.add(e.name)
    print(f"imported {len(modules) - len(failed)} of {len(modules)} modules in {time.monotonic() - t0:.1f} s")
    try:
        import torch  # type: ignore[import-not-found]
        from vllm.platforms import current_platform  # type: ignore[import-not-found]
        from vllm.vllm_flash_attn.flash_attn_interface import (  # type: ignore[import-not-found]
            FA2_AVAILABLE,
            FA3_AVAILABLE,
        )

        print(f"torch {torch.__version__}, platform {type(current_platform).__name__}, capability "
              f"{current_platform.get_device_capability()}, FA2 {FA2_AVAILABLE}, FA3 {FA3_AVAILABLE}")
    except BaseException as e:
        print(f"platform probe failed: {type(e).__name__}: {e}")
    for name, why in failed.items():
        print(f"FAILED {name}: {why}")
    if missing:
        print("MISSING modules: " + ", ".join(sorted(missing)))
    return len(failed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=ROOT / ".real")
    ap.add_argument("--cache", type=Path, default=ROOT / ".real" / "vllm-wheels")
    ap.add_argument("--limit-mb", type=float, default=PART_LIMIT / 1e6, help="largest part, in MB (10^6 bytes)")
    ap.add_argument("--check-imports", action="store_true",
                    help="build nothing: import vLLM's serving path from PYTHONPATH and report (on the GPU machine)")
    args = ap.parse_args()
    if args.check_imports:
        raise SystemExit(1 if check_imports() else 0)
    build(args.out_dir, args.cache, int(args.limit_mb * 1e6))


if __name__ == "__main__":
    main()
