#!/bin/sh
# Carry real vLLM 0.26.0 to the GPU machine in parts and check it there (docs/VLLM.md, "What carrying
# it takes"). The parts come from `python3 -m bench.real.vllm_bundle` (.real/vllm-partK.tar.xz, each a
# complete tar.xz); one device call carries one part (`carry: [".real/vllm-partK.tar.xz"]`) and runs
#   sh bench/real/vllm_device.sh part .real/vllm-partK.tar.xz          # unpack into $VLLM/site now
# and the last call (or the one after it, made at once: /tmp lasts ~30 s between calls) runs
#   sh bench/real/vllm_device.sh check      # every part of one build there? then import vLLM's serving path
#   sh bench/real/vllm_device.sh smoke      # optional: tiny Llama + random EAGLE-3 draft served, one request
# Steps may be chained in one call: `sh bench/real/vllm_device.sh part .real/vllm-part2.tar.xz check smoke`.
# The daemon under vLLM (issue 37's lane `vllm`, bench/real/lanes37.py) without the SGLang bundle:
#   sh bench/real/vllm_device.sh part .real/vllm-part2.tar.xz extras .real/daemon-extras.tar.xz lane wait 480
# (`extras`: structlog, py-spy and pystack from `python3 -m bench.real.build_bundle --daemon-extras`; `lane`
# starts the lane in the background; `wait N` polls it up to N seconds, then packs what it has into $OUT).
# Afterwards vLLM runs with PYTHONPATH=$VLLM/site (the device's torch, transformers and numpy underneath).
set -u
VLLM=${VLLM:-/tmp/vllm}
OUTDIR=${OUT:-$VLLM/out}
mkdir -p "$VLLM" "$OUTDIR"
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.1f}')"; }

unpack_part() {
  t0=$(now)
  if ! tar -xJf "$1" -C "$VLLM"; then
    echo "part $1: tar failed (truncated or corrupt?)"; return 1
  fi
  echo "part $1 unpacked in $(secs "$t0" "$(now)") s; $VLLM holds $(du -sm "$VLLM/site" | cut -f1) MB;" \
       "parts here: $(ls "$VLLM/manifest" 2>/dev/null | tr '\n' ' ')"
}

check_parts() {
  python3 - "$VLLM/manifest" <<'EOF'
import json, sys
from pathlib import Path
found = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("part*.json"))]
if not found:
    sys.exit("no part unpacked yet")
builds = {m["build"] for m in found}
want = max(m["parts"] for m in found)
have = sorted(m["part"] for m in found)
if len(builds) > 1:
    sys.exit(f"parts of different builds are mixed: {sorted(builds)}; remove {sys.argv[1]}/.. and unpack again")
if have != list(range(1, want + 1)):
    sys.exit(f"build {builds.pop()}: have parts {have} of {want}: missing {sorted(set(range(1, want + 1)) - set(have))}")
print(f"build {builds.pop()}: all {want} parts, {sum(m['files'] for m in found)} files")
EOF
}

check_imports() {
  check_parts || return 1
  t0=$(now)
  PYTHONPATH="$VLLM/site:$(pwd)" python3 -m bench.real.vllm_bundle --check-imports > "$OUTDIR/check.txt" 2>&1
  rc=$?
  grep -v "^INFO\|^WARNING\|^W[0-9]" "$OUTDIR/check.txt"
  echo "import check took $(secs "$t0" "$(now)") s"
  return $rc
}

smoke() {
  # A tiny random Llama (bench/real/models.py) and a random EAGLE-3 draft; requests send token ids.
  check_parts || return 1
  models=$VLLM/models
  python3 -m bench.real.models "$models" > /dev/null 2>&1 || { echo "making the tiny models failed"; return 1; }
  port=${VLLM_PORT:-18200}
  spec="{\"method\":\"eagle3\",\"model\":\"$models/draft\",\"num_speculative_tokens\":3}"
  t0=$(now)
  PYTHONPATH="$VLLM/site" setsid python3 -m vllm.entrypoints.openai.api_server --model "$models/target" \
    --skip-tokenizer-init --enforce-eager --speculative-config "$spec" --gpu-memory-utilization 0.3 \
    --max-model-len 2048 --port "$port" ${VLLM_ARGS:-} > "$OUTDIR/server.log" 2>&1 &
  pid=$!
  echo "$pid" > "$VLLM/server.pid"
  VLLM_T0=$t0 VLLM_PID=$pid VLLM_PORT=$port VLLM_MODEL="$models/target" VLLM_OUT="$OUTDIR" \
    VLLM_DEADLINE=${VLLM_DEADLINE:-400} python3 - <<'EOF'
import json, os, subprocess, time, urllib.request
t0, pid, port, out = float(os.environ["VLLM_T0"]), int(os.environ["VLLM_PID"]), os.environ["VLLM_PORT"], os.environ["VLLM_OUT"]
base = f"http://127.0.0.1:{port}"
deadline = t0 + float(os.environ["VLLM_DEADLINE"])
result = {"ready_s": None}
def alive():  # the server is the shell's child: once dead it stays a zombie (state Z) until the shell waits
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
while time.time() < deadline and alive():
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            if r.status == 200:
                result["ready_s"] = round(time.time() - t0, 1)
                break
    except Exception:
        pass
    time.sleep(0.5)
titles = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
result["titles"] = [l.strip() for l in titles.splitlines() if "VLLM" in l or "vllm.entrypoints" in l][:12]
if result["ready_s"] is not None:
    body = {"model": os.environ["VLLM_MODEL"], "prompt": list(range(1, 33)), "max_tokens": 32,
            "temperature": 0, "return_token_ids": True}
    t = time.time()
    for i in range(4):
        req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            answer = json.loads(r.read())
    result["completion_s"] = round((time.time() - t) / 4, 3)
    choice = answer["choices"][0]
    result["completion"] = {"finish_reason": choice.get("finish_reason"), "text": choice.get("text"),
                            "token_ids": (choice.get("token_ids") or [])[:8], "usage": answer.get("usage")}
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    result["metrics"] = [l for l in metrics.splitlines() if l.startswith(("vllm:spec_decode", "vllm:iteration_tokens_total_count", "vllm:num_requests"))][:20]
else:
    result["alive"] = alive()
print(json.dumps(result, indent=1))
open(os.path.join(out, "smoke.json"), "w").write(json.dumps(result, indent=1))
raise SystemExit(0 if result["ready_s"] is not None else 1)
EOF
  rc=$?
  kill -TERM -- "-$pid" 2>/dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null
  echo "server log: $(wc -l < "$OUTDIR/server.log") lines; last lines:"
  tail -n 15 "$OUTDIR/server.log"
  return $rc
}

start_lane() {
  check_parts || return 1
  [ "${REAL_SIMULATE:-}" = 1 ] || PYTHONPATH="$VLLM/site" python3 -m bench.real.models "$VLLM/models" > /dev/null 2>&1 || { echo "making the tiny models failed"; return 1; }
  mkdir -p "$VLLM/out37"
  PYTHONPATH="$VLLM/site:$(pwd)" setsid nohup sh -c "python3 -m bench.real.run plan --plan vllm:0:0 --real $VLLM \
    --work $VLLM/work37 --deadline 900; python3 -m bench.real.run pack --work $VLLM/work37 --out $VLLM/out37; \
    touch $VLLM/out37/ALLDONE" > "$VLLM/lane.log" 2>&1 &
  echo "lane vllm started at $(date -u +%H:%M:%S)"
}

wait_lane() {
  end=$(( $(date +%s) + $1 ))
  while [ "$(date +%s)" -lt "$end" ] && [ ! -f "$VLLM/out37/ALLDONE" ]; do sleep 5; done
  if [ ! -f "$VLLM/out37/ALLDONE" ]; then
    echo "lane still running: packing what it has"
    PYTHONPATH="$VLLM/site:$(pwd)" python3 -m bench.real.run pack --work "$VLLM/work37" --out "$VLLM/out37"
  fi
  cp "$VLLM/out37"/results-work37.json "$VLLM/out37"/files-work37.tar.gz "$OUTDIR/" 2>/dev/null
  tail -n 5 "$VLLM/lane.log"; tail -c 1500 "$VLLM/work37/vllm.log" 2>/dev/null
}

[ $# -gt 0 ] || { sed -n '2,14p' "$0"; exit 2; }
status=0
while [ $# -gt 0 ]; do
  case $1 in
    part)  shift; [ $# -gt 0 ] || { echo "part needs a file"; exit 2; }
           unpack_part "$1" || status=1 ;;
    check) check_imports || status=1 ;;
    smoke) smoke || status=1 ;;
    extras) shift; [ $# -gt 0 ] || { echo "extras needs a file"; exit 2; }
           tar -xJf "$1" -C "$VLLM" || status=1 ;;
    lane)  start_lane || status=1 ;;
    wait)  shift; [ $# -gt 0 ] || { echo "wait needs seconds"; exit 2; }
           wait_lane "$1" ;;
    *)     echo "unknown step: $1"; exit 2 ;;
  esac
  shift
done
exit $status
