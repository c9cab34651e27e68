#!/usr/bin/env bash
# What pure reads reach at each `step` seam's size, what the E4M3 GEMV's loads alone cost, and
# what one more dependent single-block kernel costs in a PDL graph (eleventh session, 2026-12-05);
# then with FULL=1 on an H200 scripts/gpu/remeasure.sh in the time left (main's shape table with the PyTorch
# anchor, ncu, the whole GPU test binary: its last kernel commit had not run on a GPU), on another
# card only the GPU test binary and selftest. One call:
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
if [ "${FULL:-0}" = 1 ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash scripts/gpu/remeasure.sh $(( $(left) - 5 ))  # the issues' card: the whole table
else
  # Another card: main's whole GPU binary and selftest (the table of this card is in
  # docs/gpu/2026-12-05-remeasure/), leaving device time for a second call.
  step gpu_main 200 env MEMRA_GPU_STEP=1 $B/gpu-main --test-threads=1
  grep -E "^test result|step preset device-host|panicked" /tmp/gpu_main.log | head -8
  step selftest 40 $B/mg-main selftest --backend cuda --out /tmp/selftest
  grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -3
  cp /tmp/selftest/summary.md "$OUT/selftest-cuda-summary.md" 2>/dev/null
  cp /tmp/gpu_main.log /tmp/selftest.log "$OUT/" 2>/dev/null
fi
echo "done in $(( $(date +%s)-STEPS_START ))s"
