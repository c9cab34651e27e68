#!/usr/bin/env bash
# What pure reads reach at each `step` seam's size, what the E4M3 GEMV's loads alone cost, and
# what one more dependent single-block kernel costs in a PDL graph (eleventh session, 2026-12-05);
# then scripts/gpu/remeasure.sh in the time left (main's shape table with the PyTorch anchor, ncu,
# the whole GPU test binary: its last kernel commit had not run on a GPU). One call:
#   bash scripts/gpu/ceiling.sh [S]     (carry target-g: mg-main / gpu-main from carry.sh main)
set -uo pipefail
source scripts/gpu/libs.sh
call_start ceiling "${1:-560}"
B=target-g
NV=("$NVCC" -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -I kernels/cuda)
step read_build 60 "${NV[@]}" -o /tmp/read_ceiling scripts/gpu/read_ceiling_bench.cu; tail -3 /tmp/read_build.log
step pdl_build 60 "${NV[@]}" -o /tmp/pdl_chain scripts/gpu/pdl_chain_bench.cu; tail -3 /tmp/pdl_build.log
step read_run 60 /tmp/read_ceiling; cat /tmp/read_run.log
step pdl_run 40 /tmp/pdl_chain 40; cat /tmp/pdl_run.log
cp /tmp/read_run.log /tmp/pdl_run.log "$OUT/" 2>/dev/null
echo "benches done in $(( $(date +%s)-STEPS_START ))s"
bash scripts/gpu/remeasure.sh $(( $(left) - 5 ))
