#!/bin/sh
# Every GPU stage of the recipe in one background job, packed after each stage into /tmp/real/out so
# that short polling calls of the device tool can bring back whatever is done (bench/real/README.md).
#   setsid nohup sh bench/real/device.sh > /tmp/real/device.log 2>&1 &
# Stages: setup, matrix (issue 14), tp2 (issue 15: both lanes), gputp (the NCCL harness); on one
# H200 for issues 22 and 24: busy (busyhang alone: GPM is per GPU), clean (clean3 alone: its GPM readings
# are its own), i24 (stall and xid),
# busyoh (the busy channels' cost on the real NVML), ranks (eight ranks captured). STAGES
# picks a subset, e.g. STAGES="tp2 gputp"; stage plan runs PLAN (run.py plan --plan), e.g.
# STAGES=plan PLAN="serve:0:0,cudagdb:1:0" ("+" separates GPUs: tp2:0+1:0). Issue 24 (not in the
# default): i24 (the SIGSTOPped scheduler's bundle with pystack, lane stall; the Xid chain, lane xid;
# one H200), i24tp2 (NCCL's RAS report of rank 1 SIGSTOPped, two GPUs), ranks (bench/gpu_ranks.py).
# Issue 32: i32a (lane stranger), i32b (lane cpuhog), i32c (lane cpupin: the server pinned to two CPUs
# shared with 8 hogs), i32d (lane cpupin1: one CPU, 32 hogs), one H200, as separate stages: they would share GPU 0.
# Issue 23: mn2 (real SGLang as two nodes of one group, one daemon per node; two GPUs).
# Issue 35: i35 (lane i35 on one H200: power at idle/spin/work, the NCCL Flight Recorder pipe with a
# one-rank group, real SGLang's LOCK_GIL hang after load then the capture spin: the culprit first line).
# Issue 51: i51 (lane frontstop, bench/real/lanes51.py: the server's main process SIGSTOPped under four
# clients: judged at the first failed health check, the front end named on line 1).
# Issue 49: i49 (lane recovery, bench/real/lanes49.py: a failed promote goes straight back to the rung that
# served; the front end SIGSTOPped on that rung is relaunched on it; the daemon's own CPU and RSS; ~10 min).
# Issue 36: i36 (lane fast, bench/real/lanes36.py: cold start, serving stall and the warm relaunch, a
# start-up deadlock under a learned window, a cold launch again; the outage in its parts; one H200, ~8 min);
# i36xid (lane xid again: the relaunch after a real Xid, whose launch_timeline times the warm-up request).
# Issue 37: i37 (lane vllm, bench/real/lanes37.py: real vLLM 0.26.0 under the daemon, its site unpacked by
# vllm_device.sh into /tmp/vllm/site; beside another job: OUTDIR=/tmp/real/out37 STAGES=i37 sh bench/real/device.sh).
set -u
REAL=${REAL:-/tmp/real}
OUTDIR=${OUTDIR:-$REAL/out}  # a second job beside a running one takes its own
STAGES=${STAGES:-"matrix tp2 gputp"}
mkdir -p "$OUTDIR"
stamp() { echo "$(date -u +%H:%M:%S) $*" >> "$OUTDIR/stages.txt"; }
stamp setup-begin
python3 -m bench.real.run setup --real "$REAL" > "$OUTDIR/setup.json" 2>&1
stamp setup-end
# The lanes import the daemon (pydantic, fastapi, structlog), which the bundle carries.
export PYTHONPATH="$REAL/site:$(pwd)"
for stage in $STAGES; do
  stamp "$stage-begin"
  case $stage in
    matrix) python3 -m bench.real.run matrix --real "$REAL" --work "$REAL/work" --deadline 580
            python3 -m bench.real.run pack --work "$REAL/work" --out "$OUTDIR" ;;
    tp2)    python3 -m bench.real.run tp2 --real "$REAL" --work "$REAL/work2" --deadline 400
            python3 -m bench.real.run pack --work "$REAL/work2" --out "$OUTDIR" ;;
    tp2b)   python3 -m bench.real.run tp2b --real "$REAL" --work "$REAL/work3" --deadline 300
            python3 -m bench.real.run pack --work "$REAL/work3" --out "$OUTDIR" ;;
    plan)   python3 -m bench.real.run plan --plan "$PLAN" --real "$REAL" --work "$REAL/work4" --deadline 560
            python3 -m bench.real.run pack --work "$REAL/work4" --out "$OUTDIR" ;;
    i24)    python3 -m bench.real.run plan --plan "stall:0:0,xid:0:75" --real "$REAL" --work "$REAL/work24" --deadline 560
            python3 -m bench.real.run pack --work "$REAL/work24" --out "$OUTDIR" ;;
    i32a)   python3 -m bench.real.run plan --plan "stranger:0:0" --real "$REAL" --work "$REAL/work32a" --deadline 500
            python3 -m bench.real.run pack --work "$REAL/work32a" --out "$OUTDIR" ;;
    i32b)   python3 -m bench.real.run plan --plan "cpuhog:0:0" --real "$REAL" --work "$REAL/work32b" --deadline 500
            python3 -m bench.real.run pack --work "$REAL/work32b" --out "$OUTDIR" ;;
    i32c)   python3 -m bench.real.run plan --plan "cpupin:0:0" --real "$REAL" --work "$REAL/work32c" --deadline 500
            python3 -m bench.real.run pack --work "$REAL/work32c" --out "$OUTDIR" ;;
    i32d)   python3 -m bench.real.run plan --plan "cpupin1:0:0" --real "$REAL" --work "$REAL/work32d" --deadline 500
            python3 -m bench.real.run pack --work "$REAL/work32d" --out "$OUTDIR" ;;
    i36)    python3 -m bench.real.run plan --plan "fast:0:0" --real "$REAL" --work "$REAL/work36" --deadline 540
            python3 -m bench.real.run pack --work "$REAL/work36" --out "$OUTDIR" ;;
    i36xid) python3 -m bench.real.run plan --plan "xid:0:0" --real "$REAL" --work "$REAL/work36x" --deadline 500
            python3 -m bench.real.run pack --work "$REAL/work36x" --out "$OUTDIR" ;;
    i37)    python3 -m bench.real.run plan --plan "vllm:0:0" --real "$REAL" --work "$REAL/work37" --deadline 720
            python3 -m bench.real.run pack --work "$REAL/work37" --out "$OUTDIR" ;;
    i24tp2) python3 -m bench.real.run plan --plan "tp2_ras:0+1:0" --real "$REAL" --work "$REAL/work24b" --deadline 400
            python3 -m bench.real.run pack --work "$REAL/work24b" --out "$OUTDIR" ;;
    i35)    python3 -m bench.real.run plan --plan "i35:0:0" --real "$REAL" --work "$REAL/work35" --deadline 540
            python3 -m bench.real.run pack --work "$REAL/work35" --out "$OUTDIR" ;;
    i49)    python3 -m bench.real.run plan --plan "recovery:0:0" --real "$REAL" --work "$REAL/work49" --deadline 780
            python3 -m bench.real.run pack --work "$REAL/work49" --out "$OUTDIR" ;;
    i51)    python3 -m bench.real.run plan --plan "${PLAN51:-frontstop:0:0,overhead:0:45}" --real "$REAL" --work "$REAL/work51" --deadline "${DEADLINE51:-540}"
            python3 -m bench.real.run pack --work "$REAL/work51" --out "$OUTDIR" ;;
    mn2)    python3 -m bench.real.run lane mn2 --gpu 0,1 --real "$REAL" --work "$REAL/work23"
            cp "$REAL/work23/result.json" "$OUTDIR/mn2-result.json" 2>/dev/null ;;
    busy)   python3 -m bench.real.run plan --plan "busyhang:0:0" --real "$REAL" --work "$REAL/work22a" --deadline 400
            python3 -m bench.real.run pack --work "$REAL/work22a" --out "$OUTDIR" ;;
    clean)  python3 -m bench.real.run plan --plan "clean3:0:0" --real "$REAL" --work "$REAL/work22b" --deadline 560
            python3 -m bench.real.run pack --work "$REAL/work22b" --out "$OUTDIR" ;;
    busyoh) PYTHONPATH=$REAL/site:. PATH=$REAL/bin:$PATH timeout 120 python3 -m bench.busy_overhead --no-write > "$OUTDIR/busyoh.log" 2>&1 ;;
    ranks)  PYTHONPATH=$REAL/site:. PATH=$REAL/bin:$PATH timeout 300 python3 -m bench.gpu_ranks --ranks 8 --gb 2 \
            --out "$OUTDIR/ranks" > "$OUTDIR/ranks.log" 2>&1 ;;
    gputp)  PYTHONPATH=$REAL/site:. PATH=$REAL/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
            NVSHMEM_DISABLE_NVLS=1 timeout 240 python3 -m bench.gpu_tp --backend nccl --tp-size 2 \
            --out "$OUTDIR/gputp" > "$OUTDIR/gputp.log" 2>&1 ;;
  esac
  stamp "$stage-end"
done
touch "$OUTDIR/ALLDONE"
