#!/usr/bin/env bash
# Issue 27, the call still owed (it lost the device on 2026-12-04): the next candidate, c — the
# block-per-lane-only expert kernels at 5 blocks per SM (48 registers) — through the whole GPU test
# binary and `selftest --backend cuda`, its b1/b8 bench interleaved with d (6 blocks per SM, 40
# registers, 20 bytes spilled), and ncu of c. Build c with both `__launch_bounds__(GEMV_THREADS, 4)`
# of the `*_bpl_f32` kernels in kernels/cuda/experts.cu at 5 (d: 6); carry target-ab2/ (mg-c, mg-d,
# the GPU test binary of c).
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call bplonly2
gpu_tools
T=$(ls target-ab2/gpu-* | head -1)
steps_start "${1:-560}"
gpu_modules ""   # the whole GPU test binary, into /tmp/gpu_.log
step selftest 90 target-ab2/mg-c selftest --backend cuda --out /tmp/selftest
grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -5
for round in 1 2; do
  for v in c d; do
    n=b1-$v-$round; step $n 40 target-ab2/mg-$v bench --backend cuda --preset step --layers 2 --graph --no-torch --batch 1 --out /tmp/$n
    echo "$n: $(bench_summary /tmp/$n.log)"
  done
done
for v in c d; do
  n=b8-$v; step $n 40 target-ab2/mg-$v bench --backend cuda --preset step --layers 2 --graph --no-torch --batch 8 --out /tmp/$n
  echo "$n: $(bench_summary /tmp/$n.log)"; grep -E "per token" /tmp/$n.log | head -2
done
echo "ncu c:"; ncu_b1 "ncu-b1-c" 40 "target-ab2/mg-c"
cp /tmp/selftest/summary.md "$OUT/selftest-cuda-summary.md" 2>/dev/null
tar czf $OUT/bplonly2.tgz -C /tmp $(cd /tmp && ls b1-*.log b8-*.log gpu_.log selftest.log 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
