#!/bin/sh
# Every GPU stage of the recipe in one background job, packed after each stage into /tmp/real/out so
# that short polling calls of the device tool can bring back whatever is done (bench/real/README.md).
#   setsid nohup sh bench/real/device.sh > /tmp/real/device.log 2>&1 &
# Stages: setup, matrix (issue 14), tp2 (issue 15: both lanes), gputp (the NCCL harness). STAGES
# picks a subset, e.g. STAGES="tp2 gputp"; stage plan runs PLAN (run.py plan --plan), e.g.
# STAGES=plan PLAN="serve:0:0,cudagdb:1:0" ("+" separates GPUs: tp2:0+1:0).
set -u
REAL=${REAL:-/tmp/real}
OUTDIR=$REAL/out
STAGES=${STAGES:-"matrix tp2 gputp"}
mkdir -p "$OUTDIR"
stamp() { echo "$(date -u +%H:%M:%S) $*" >> "$OUTDIR/stages.txt"; }
stamp setup-begin
python3 bench/real/run.py setup --real "$REAL" > "$OUTDIR/setup.json" 2>&1
stamp setup-end
# The lanes import the daemon (pydantic, fastapi, structlog), which the bundle carries.
export PYTHONPATH="$REAL/site:$(pwd)"
for stage in $STAGES; do
  stamp "$stage-begin"
  case $stage in
    matrix) python3 bench/real/run.py matrix --real "$REAL" --work "$REAL/work" --deadline 580
            python3 bench/real/run.py pack --work "$REAL/work" --out "$OUTDIR" ;;
    tp2)    python3 bench/real/run.py tp2 --real "$REAL" --work "$REAL/work2" --deadline 400
            python3 bench/real/run.py pack --work "$REAL/work2" --out "$OUTDIR" ;;
    tp2b)   python3 bench/real/run.py tp2b --real "$REAL" --work "$REAL/work3" --deadline 300
            python3 bench/real/run.py pack --work "$REAL/work3" --out "$OUTDIR" ;;
    plan)   python3 bench/real/run.py plan --plan "$PLAN" --real "$REAL" --work "$REAL/work4" --deadline 560
            python3 bench/real/run.py pack --work "$REAL/work4" --out "$OUTDIR" ;;
    gputp)  PYTHONPATH=$REAL/site:. PATH=$REAL/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
            NVSHMEM_DISABLE_NVLS=1 timeout 240 python3 bench/gpu_tp.py --backend nccl --tp-size 2 \
            --out "$OUTDIR/gputp" > "$OUTDIR/gputp.log" 2>&1 ;;
  esac
  stamp "$stage-end"
done
touch "$OUTDIR/ALLDONE"
