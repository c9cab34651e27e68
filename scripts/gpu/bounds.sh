#!/usr/bin/env bash
# Issue 27, 2026-12-05 (sixth session): the block-per-lane expert kernels' blocks per SM. The
# fifth session's prepared call measured 6 per SM (40 registers) at 0.86x the experts seam of 4 per
# SM; here 4 (e: main + the collect patch), 6 (v6), 8 (v8: 32 registers) and gate/up 8 with down 6
# (v86: no spill in either) are benched interleaved at b1 and b8, and the fastest b1 layer goes
# through the whole GPU test binary with the step-preset device-host gate (MEMRA_GPU_STEP=1),
# `selftest --backend cuda`, the default run and ncu.
# Carry target-v/ (mg-<v> and gpu-<v>, each `strip`ped; kernels/cuda/experts.cu's two
# `*_bpl_f32` launch bounds edited per variant, everything else main, the collect patch landed).
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call bounds
gpu_tools
steps_start "${1:-560}"
for round in 0 1; do
  for v in e v6 v8 v86; do
    bench_step b1-$v-$round target-v/mg-$v 1
  done
done
for v in e v6 v86; do
  bench_step b8-$v target-v/mg-$v 8
done
# The winner: the lowest mean of the b1 gated-layer latencies over both rounds.
W=$(for v in v6 v8 v86; do
  awk -v v=$v '/^[01] / && NF==5 {s+=$3; n++} END {if (n) printf "%s %.2f\n", v, s/n}' /tmp/b1-$v-*.log
done | sort -k2 -n | head -1 | cut -d' ' -f1)
echo "winner: $W"
T=target-v/gpu-$W
step gpu_all 240 env MEMRA_GPU_STEP=1 $T --test-threads=1
grep -E "^test result|step preset|panicked" /tmp/gpu_all.log | head -12
step selftest 60 target-v/mg-$W selftest --backend cuda --out /tmp/selftest
grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -3
step run 60 target-v/mg-$W run --backend cuda --quiet --out /tmp/run
tail -2 /tmp/run.log
echo "ncu $W:"; ncu_b1 "ncu-b1-$W" 40 "target-v/mg-$W"
cp /tmp/selftest/summary.md "$OUT/selftest-cuda-summary.md" 2>/dev/null
tar czf $OUT/bounds.tgz -C /tmp $(cd /tmp && ls b1-*.log b8-*.log gpu_all.log selftest.log run.log 2>/dev/null)
echo "done in $(( $(date +%s)-STEPS_START ))s"
