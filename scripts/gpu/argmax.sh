#!/usr/bin/env bash
# Issue 27, 2026-12-05 (sixth session), the last call (ran 72 s of 110: the row floor and the
# benches were cut by the deadline; the row floor and main's whole GPU binary then ran in
# scripts/gpu/next.sh, docs/gpu/2026-12-05-pdl/call1): argmax with its loads batched and one value
# per thread (x: 128 blocks for a 32,768 vocabulary instead of 16 blocks of 8 dependent loads)
# against main (base), and how fast a single-row kernel can be here at all
# (scripts/gpu/row_floor_bench.cu under ncu). Carry target-w/ (mg-base = main at 93c6b6e, mg-x and
# gpu-x = main + the argmax change, each `strip`ped).
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call argmax
gpu_tools
T=target-w/gpu-x
steps_start "${1:-180}"
gpu_modules "cuda_kernels::" "cuda_step::router_and_argmax"
step selftest 50 target-w/mg-x selftest --backend cuda --out /tmp/selftest
grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -3
echo "ncu x:"; ncu_b1 "ncu-b1-x" 35 "target-w/mg-x"
row_floor
for v in base x; do
  bench_step b1-$v-$(ls /tmp/b1-$v-*.log 2>/dev/null | wc -l) target-w/mg-$v 1
done
tar czf $OUT/argmax.tgz -C /tmp $(cd /tmp && ls floor_*.log gpu_*.log selftest.log b1-*.log 2>/dev/null)
echo "done in $(( $(date +%s)-STEPS_START ))s"
