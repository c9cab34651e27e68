#!/usr/bin/env bash
# Issue 27, 2026-12-05 (sixth session), the last call (ran 72 s of 110: the row floor and the
# benches were cut by the deadline and are still to run): argmax with its loads batched and one value
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
step floor_build 40 "$NVCC" -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
  -I kernels/cuda -o /tmp/row_floor scripts/gpu/row_floor_bench.cu
step floor_run 20 /tmp/row_floor; cat /tmp/floor_run.log
for cc in all none; do
  # 25 launches per kernel and round, two rounds: the first 10 of each kernel are left out.
  step floor_ncu_$cc 30 "$NCU" --clock-control none --cache-control $cc --metrics gpu__time_duration.sum --csv \
    /tmp/row_floor 25
  cp /tmp/floor_ncu_$cc.log "$OUT/floor-ncu-$cc.csv"
  echo "row floor, ncu cache-control $cc:"
  grep -E '"(empty|copy_row|norm_shape)' /tmp/floor_ncu_$cc.log | awk -F'","' '{k=$5; sub(/\(.*/,"",k); v=$NF; gsub(/[",]/,"",v); c[k]++; if (c[k] > 10) {s[k]+=v; n[k]++}} END {for (k in s) printf "  %-12s %3d launches  mean %7.1f ns\n", k, n[k], s[k]/n[k]}'
done
for v in base x; do
  bench_step b1-$v-$(ls /tmp/b1-$v-*.log 2>/dev/null | wc -l) target-w/mg-$v 1
done
tar czf $OUT/argmax.tgz -C /tmp $(cd /tmp && ls floor_*.log gpu_*.log selftest.log b1-*.log 2>/dev/null)
echo "done in $(( $(date +%s)-STEPS_START ))s"
