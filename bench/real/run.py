"""Real SGLang under the daemon, on the GPU machine. One entry point, several steps:

    python3 -m bench.real.run setup   --bundle .real/bundle.tar.xz     # unpack, make the tiny models
    python3 -m bench.real.run matrix  --work /tmp/real/work            # issue 14's lanes, in parallel
    python3 -m bench.real.run tp2     --work /tmp/real/work2           # issue 15: tensor parallelism 2
    python3 -m bench.real.run tp2b    --work /tmp/real/work3           # a two-rank transcript
    python3 -m bench.real.run plan    --plan stall:0:0,deadlock:1:0    # chosen lanes (lane:gpus:delay)
    python3 -m bench.real.run pack    --work DIR --out DIR             # results.json + transcripts.tar.gz

From the repository root (`-m` puts it on the path).

The lanes import the daemon, so PYTHONPATH must hold the bundle's site/ and the repo (device.sh
sets it).

The bundle goes into a private directory (`--real`, default /tmp/real): `site/` is put first on the
server's PYTHONPATH (and the daemon's, for fastapi/pydantic/structlog), `bin/py-spy` on PATH; nothing
is installed into the machine's Python. `bench/real/report.py` turns results.json into the "Real
SGLang" section of docs/BENCHMARKS.md, on any machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# Lanes of the matrix: (lane, GPU, delay before it starts). Two servers share a GPU only with their
# start-ups 45 s apart: SGLang sizes its KV pool from the memory free before its weights load.
MATRIX = (("serve", "0", 0.0), ("ladder", "1", 0.0), ("transcript", "0", 45.0), ("piecewise", "1", 45.0))
TP2 = (("tp2", "0,1", 0.0), ("tp2_deadlock", "0,1", 45.0))


def setup(bundle: Path, real: Path) -> dict[str, Any]:
    t0 = time.time()
    if not (real / "site" / "sglang").is_dir():
        real.mkdir(parents=True, exist_ok=True)
        with tarfile.open(bundle) as tar:
            tar.extractall(real)
    env = {**os.environ, "PYTHONPATH": str(real / "site")}
    subprocess.run([sys.executable, "-m", "bench.real.models", str(real / "models")],
                   env=env, check=True, cwd=ROOT)
    return {"setup_s": round(time.time() - t0, 1)}


def versions(real: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(real / "site")}
    code = ("import json, sglang, torch, transformers; print(json.dumps({'sglang': sglang.__version__, "
            "'torch': torch.__version__, 'transformers': transformers.__version__, "
            "'gpu': torch.cuda.get_device_name(0), 'gpus': torch.cuda.device_count()}))")
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out: dict[str, Any] = {"python": platform.python_version(), "date": now}
    try:
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
        out.update(json.loads(r.stdout.strip().splitlines()[-1]))
    except Exception as err:
        out["versions_error"] = repr(err)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        out["driver"] = smi[0].split(",")[0].strip() if smi else None
        out["nvidia_smi"] = smi
    except (OSError, subprocess.TimeoutExpired):
        out["driver"] = None
    out["cuda_gdb"] = shutil.which("cuda-gdb") or next(
        (p for p in ("/usr/local/cuda/bin/cuda-gdb",) if os.access(p, os.X_OK)), None)
    return out


def lane(name: str, work: Path, real: Path, gpu: str) -> None:
    from bench.real import scenarios, transcript

    work.mkdir(parents=True, exist_ok=True)
    if name == "cudagdb":
        subprocess.run([sys.executable, "-m", "bench.real.cudagdb_probe", "--out", str(work)],
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu}, check=False, cwd=ROOT)
        return
    if name == "transcript" or name == "transcript_tp2":
        tp = 2 if name.endswith("tp2") else 1
        meta = transcript.record(work / "transcript", real, real / "models", gpu, tp=tp)
        (work / "result.json").write_text(json.dumps({"lane": name, "meta": meta}, indent=1, default=str))
        return
    from bench.real import busy_lanes, lanes24, lanes32, lanes35, lanes36, lanes37, lanes49, lanes51, multinode_lanes

    lanes = {
        **scenarios.LANES,  # issue 14's matrix, issue 15's tp2
        **lanes24.LANES,  # issue 24: xid, tp2_ras
        **lanes32.LANES,  # issue 32: stranger, cpuhog, cpupin
        **lanes36.LANES,  # issue 36: fast (outage parts, caches, learned window)
        **busy_lanes.LANES,  # issue 22: busy hangs at start-up
        **lanes35.LANES,  # issue 35: the culprit first, the FR pipe, power of a spin vs work
        **lanes37.LANES,  # issue 37: real vLLM under the daemon
        **lanes49.LANES,  # issue 49: a failed promote and a second fault on a rung that served, on real SGLang
        **lanes51.LANES,  # issue 51: the stopped front end named first, judged at the first failed check
        **multinode_lanes.LANES,  # issue 23: two nodes of one group, one daemon each
    }
    res = lanes[name](work, real, real / "models", gpu)
    (work / "result.json").write_text(json.dumps(res, indent=1, default=str))


def run_lanes(plan: tuple[tuple[str, str, float], ...], work: Path, real: Path, deadline_s: float) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "versions.json").write_text(json.dumps(versions(real), indent=1))
    t0 = time.time()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    pending = list(plan)
    while pending or any(p.poll() is None for p in procs.values()):
        for item in list(pending):
            name, gpu, delay = item
            if time.time() - t0 >= delay:
                pending.remove(item)
                log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "bench.real.run", "lane", name, "--gpu", gpu, "--work", str(work / name),
                     "--real", str(real)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if time.time() - t0 > deadline_s:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(1.0)
    status = {n: p.returncode for n, p in procs.items()}
    (work / "DONE").write_text(json.dumps({"lanes": status, "seconds": round(time.time() - t0, 1)}))
    return status


def pack(work: Path, out: Path) -> None:
    """results.json (every lane's result) and one tar.gz of transcripts, server logs and daemon logs."""
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for f in ("versions.json", "DONE"):
        if (work / f).exists():
            results[f.split(".")[0].lower()] = json.loads((work / f).read_text())
    for res in sorted(work.glob("*/result.json")):
        results[res.parent.name] = json.loads(res.read_text())
    (out / f"results-{work.name}.json").write_text(json.dumps(results, indent=1, default=str))
    with tarfile.open(out / f"files-{work.name}.tar.gz", "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            if not path.is_file() or path.stat().st_size > 8_000_000:
                continue
            rel = path.relative_to(work)
            if "diagnostics" in rel.parts and path.suffix not in (".json", ".txt"):
                continue
            tar.add(path, arcname=str(rel))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("setup", "matrix", "tp2", "tp2b", "plan", "lane", "pack"))
    ap.add_argument("name", nargs="?")
    ap.add_argument("--bundle", type=Path, default=ROOT / ".real" / "bundle.tar.xz")
    ap.add_argument("--real", type=Path, default=Path("/tmp/real"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/real/work"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/real/out")))
    ap.add_argument("--gpu", default="0")
    ap.add_argument("--deadline", type=float, default=1000.0)
    ap.add_argument("--plan", default="", help="for step plan: lane:gpus:delay,... e.g. serve:0:0,cudagdb:1:0")
    args = ap.parse_args()
    if args.step == "setup":
        print(json.dumps(setup(args.bundle, args.real)))
    elif args.step == "matrix":
        print(json.dumps(run_lanes(MATRIX, args.work, args.real, args.deadline)))
    elif args.step == "tp2":  # issue 15's two lanes side by side, start-ups 45 s apart
        print(json.dumps(run_lanes(TP2, args.work, args.real, args.deadline)))
    elif args.step == "tp2b":  # a two-rank transcript for the fixtures
        plan = (("transcript_tp2", "0,1", 0.0),)
        print(json.dumps(run_lanes(plan, args.work, args.real, args.deadline)))
    elif args.step == "plan":  # any lanes, e.g. one that failed, again
        plan = tuple((n, g.replace("+", ","), float(d)) for n, g, d in (x.split(":") for x in args.plan.split(",")))
        print(json.dumps(run_lanes(plan, args.work, args.real, args.deadline)))
    elif args.step == "lane":
        lane(str(args.name), args.work, args.real, args.gpu)
    else:
        pack(args.work, args.out)


if __name__ == "__main__":
    main()
