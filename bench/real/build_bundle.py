"""Build the device bundle for real SGLang: one tar.xz of unzipped, trimmed cp312 wheels.

Run on a CPU machine that reaches the package index (any Python 3.10+):

    python3 -m bench.real.build_bundle            # writes .real/bundle.tar.xz (git-ignored)

The list, with the reason each package travels, is `bench/real/packages.toml`. The archive holds
`site/` (put it first on PYTHONPATH) and `bin/py-spy`; on the device `bench/real/run.py` unpacks it
into a private directory. sglang never becomes a dependency of the daemon: it lives only in the
server's environment (`[server] command` and `env`).
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PLATFORMS = (
    "manylinux_2_34_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
LIMIT_BYTES = 56 * 1024 * 1024  # leaves room for the project in one 64 MiB device call


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    why: str
    trim: tuple[str, ...] = ()


def read_packages(path: Path = HERE / "packages.toml") -> tuple[Package, ...]:
    doc = tomllib.loads(path.read_text())
    out = []
    for entry in doc["package"]:
        if not entry.get("why"):
            raise ValueError(f"{path}: package {entry.get('name')!r} has no reason (`why`)")
        out.append(Package(entry["name"], entry["version"], entry["why"], tuple(entry.get("trim", ()))))
    names = [p.name for p in out]
    if len(names) != len(set(names)):
        raise ValueError(f"{path}: a package is listed twice")
    return tuple(out)


def download(pkgs: tuple[Package, ...], dest: Path, platforms: tuple[str, ...] = PLATFORMS) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for plat in platforms:
        cmd += ["--platform", plat]
    cmd += [f"{p.name}=={p.version}" for p in pkgs]
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("*.whl"))
    wanted = {_norm(p.name): p.version for p in pkgs}
    chosen = [w for w in wheels if wanted.get(_norm(w.name.split("-")[0])) == w.name.split("-")[1]]
    missing = set(wanted) - {_norm(w.name.split("-")[0]) for w in chosen}
    if missing:
        raise SystemExit(f"no wheel downloaded for: {', '.join(sorted(missing))}")
    return chosen


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def unpack(wheel: Path, site: Path, bindir: Path) -> None:
    """Unzip a wheel as pip would lay it out: `.data/purelib|platlib` into site, `scripts` into bin."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = info.filename.split("/")
            if parts[0].endswith(".data") and len(parts) > 2:
                kind, rest = parts[1], "/".join(parts[2:])
                if kind in ("purelib", "platlib"):
                    target = site / rest
                elif kind == "scripts":
                    target = bindir / rest
                else:
                    continue
            else:
                target = site / info.filename
            if info.is_dir():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            if (parts[0].endswith(".data") and parts[1] == "scripts") or target.suffix == ".so":
                target.chmod(0o755)


def trim(site: Path, patterns: tuple[str, ...]) -> int:
    removed = 0
    for pat in patterns:
        parent = site / Path(pat).parent
        if not parent.exists():
            continue
        for child in parent.iterdir():
            if fnmatch.fnmatch(child.name, Path(pat).name):
                removed += _size(child)
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    return removed


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _pack(pkgs: tuple[Package, ...], cache: Path, stage: Path, out: Path) -> int:
    """Download and unpack `pkgs` into `stage` (site/, bin/), trim them, tar.xz them to `out`; the
    bytes trimmed."""
    wheels = download(pkgs, cache)
    shutil.rmtree(stage, ignore_errors=True)
    site, bindir = stage / "site", stage / "bin"
    bindir.mkdir(parents=True)
    for w in wheels:
        unpack(w, site, bindir)
    trimmed = sum(trim(site, p.trim) for p in pkgs)
    for cache_dir in site.rglob("__pycache__"):
        shutil.rmtree(cache_dir, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:xz", preset=7) as tar:
        tar.add(site, arcname="site")
        tar.add(bindir, arcname="bin")
    return trimmed


def build(out: Path, cache: Path) -> Path:
    pkgs = read_packages()
    stage = cache / "stage"
    trimmed = _pack(pkgs, cache, stage, out)
    size = out.stat().st_size
    print(f"{len(pkgs)} packages, {trimmed / 1e6:.0f} MB trimmed, unpacked {_size(stage) / 1e6:.0f} MB, "
          f"archive {out} {size / 1e6:.1f} MB")
    if size > LIMIT_BYTES:
        raise SystemExit(f"archive is {size / 1e6:.1f} MB, over {LIMIT_BYTES / 1e6:.0f} MB: trim more")
    return out


# The daemon's own needs that neither the device image nor vLLM's site (bench/real/vllm_bundle.py) has:
# with these beside vLLM's parts, a vLLM run needs no SGLang bundle (one device call fewer).
DAEMON_EXTRAS = ("structlog", "py-spy", "pystack")


def build_daemon_extras(out: Path, cache: Path) -> Path:
    pkgs = tuple(p for p in read_packages() if p.name in DAEMON_EXTRAS)
    _pack(pkgs, cache, cache / "stage-extras", out)
    print(f"{', '.join(p.name for p in pkgs)}: archive {out} {out.stat().st_size / 1e6:.1f} MB")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cache", type=Path, default=ROOT / ".real" / "wheels")
    ap.add_argument("--daemon-extras", action="store_true",
                    help=f"only {', '.join(DAEMON_EXTRAS)} (-> .real/daemon-extras.tar.xz), for a vLLM run")
    args = ap.parse_args()
    if args.daemon_extras:
        build_daemon_extras(args.out or ROOT / ".real" / "daemon-extras.tar.xz", args.cache)
    else:
        build(args.out or ROOT / ".real" / "bundle.tar.xz", args.cache)


if __name__ == "__main__":
    main()
