#!/usr/bin/env bash
# 2026-12-04 (second session), one call: an A/B of three builds of the block-per-lane E4M3 kernels
# carried side by side (target-gpu/memra-gates-v0|v1|v2; issue 27):
#   v0 x staged one value per load (the kernels that landed), v1 staged by batched loads and, in the
#   dense GEMV only, each thread's first pair of codes read before the staging, v2 batched staging
#   only (v2 = docs/gpu/2026-12-04-staging/v2-batched-staging.patch on the landed kernels; v1 also
#   reads the first pair before the staging in gemv_bpl). bench b1 interleaved (v0 v1 v2, twice), b8 once each, ncu of v0 and v2, and the GPU
#   modules against the twins with the test binary of v2.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call staging-ab
gpu_tools
steps_start "${FINAL_DEADLINE:-420}"
for round in 1 2; do
  for v in v0 v1 v2; do
    n=b1-$v-$round; step $n 30 target-gpu/memra-gates-$v bench --backend cuda --preset step --layers 2 --graph --no-torch --batch 1 --out /tmp/$n
    echo "$n: $(bench_summary /tmp/$n.log)"
  done
done
for v in v0 v1 v2; do
  n=b8-$v; step $n 30 target-gpu/memra-gates-$v bench --backend cuda --preset step --layers 2 --graph --no-torch --batch 8 --out /tmp/$n
  echo "$n: $(grep -E '^[01] ' /tmp/$n.log | awk 'NF==7 {printf "L%s exp %s; ", $1, $6} NF==5 {printf "L%s gated %s; ", $1, $3}')"
done
gpu_modules cuda_kernels:: cuda_step:: cuda_lane_grid::
for v in v0 v2; do
  echo "ncu $v:"; ncu_b1 "ncu-b1-$v" 40 "target-gpu/memra-gates-$v"
done
tar czf $OUT/staging-ab.tgz -C /tmp $(cd /tmp && ls *.log 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
