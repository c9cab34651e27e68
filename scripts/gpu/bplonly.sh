#!/usr/bin/env bash
# Issue 27: the grouped expert kernels in block-per-lane-only forms (expert_gate_up_bpl_f32,
# expert_down_bpl_f32: 64 registers, 4 blocks per SM, against 80 registers and 3 for the general
# kernels). The whole GPU test binary of the new build, then the b1/b8 bench of three builds
# interleaved — a = before, b = 4 blocks per SM, c = 5 (48 registers) — and ncu of a and b.
# Carry target-ab/ (mg-a, mg-b, mg-c, the GPU test binary of b).
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call bplonly
gpu_tools
T=$(ls target-ab/gpu-* | head -1)
steps_start "${1:-560}"
gpu_modules ""   # the whole GPU test binary, into /tmp/gpu_.log
for round in 1 2; do
  for v in a b c; do
    n=b1-$v-$round; step $n 40 target-ab/mg-$v bench --backend cuda --preset step --layers 2 --graph --no-torch --batch 1 --out /tmp/$n
    echo "$n: $(bench_summary /tmp/$n.log)"
  done
done
for v in a b c; do
  n=b8-$v; step $n 40 target-ab/mg-$v bench --backend cuda --preset step --layers 2 --graph --no-torch --batch 8 --out /tmp/$n
  echo "$n: $(bench_summary /tmp/$n.log)"
done
for v in a b; do
  echo "ncu $v:"; ncu_b1 "ncu-b1-$v" 40 "target-ab/mg-$v"
done
tar czf $OUT/bplonly.tgz -C /tmp $(cd /tmp && ls b1-*.log b8-*.log gpu_.log 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
