#!/usr/bin/env bash
# Weights before the wait (branch early, prepared in the ninth session, 2026-12-05, when no device
# came after call 1 of docs/gpu/2026-12-05-pdl2/), the landed launch-order test, and issue 24's shape
# table. Two calls of about 9 minutes each (timeout_s 600):
#   bash scripts/gpu/early.sh 1 [S]   pdl's `cuda_launch::`; b1 of pdl, early and early2 interleaved
#                                     (two rounds); early2's GEMV and norm twins and step-preset gate;
#                                     b8 of pdl and early2; the shape table's b1 and b8 with the
#                                     PyTorch anchor (S: seconds the steps may take, default 565)
#   bash scripts/gpu/early.sh 2 [S]   early2's whole GPU binary with the step-preset gate and
#                                     selftest (if it won call 1), ncu of pdl and early2, the rest of
#                                     the shape table (b2, b4, t2, t4, t8)
# Carry target-g/ (stripped, built on the dev machine): mg-pdl / gpu-pdl = main at 99a50e4 (PDL
# landed); mg-early = branch early's first commit (the BF16 GEMVs start cp.async copies of each
# warp's first vector of weights before kernel_entry()'s wait); mg-early2 / gpu-early2 = early's
# head (also rmsnorm and add_rmsnorm load their weights before the wait). early2 (or early) lands
# if its b1 layer beats pdl's in both rounds and its whole GPU binary passes.
set -uo pipefail
source scripts/gpu/libs.sh
part=${1:-1}
call_start early-$part "${2:-565}"
B=target-g
shape_rows() {
  step shape-b$1 100 $B/mg-pdl bench --backend cuda --preset step --layers 2 --graph --batch $1 --out /tmp/shape-b$1
  grep -E "per token|fastest form|overhead" /tmp/shape-b$1.log | head -4
}
shape_cols() {
  step shape-t$1 40 $B/mg-pdl bench --backend cuda --preset step --layers 2 --graph --no-torch --columns $1 \
    --out /tmp/shape-t$1
  grep -E "per token" /tmp/shape-t$1.log | head -2
}
if [ "$part" = 1 ]; then
  step gpu_launch 120 $B/gpu-pdl --test-threads=1 cuda_launch::
  grep -E "^test result|^test cuda_launch|panicked" /tmp/gpu_launch.log | head -6
  for round in 0 1; do
    for v in pdl early early2; do bench_step b1-$v-$round $B/mg-$v 1; done
  done
  # One filter per run (the test binary takes one).
  for t in batched_and_small_gemvs norms_256_lanes step_preset_device_host_gate; do
    step gpu_early2_$t 40 env MEMRA_GPU_STEP=1 $B/gpu-early2 --test-threads=1 cuda_step::$t
    grep -E "^test result|step preset device-host|panicked" /tmp/gpu_early2_$t.log | head -4
  done
  for v in pdl early2; do bench_step b8-$v $B/mg-$v 8; done
  shape_rows 1; shape_rows 8
else
  step gpu_early2 230 env MEMRA_GPU_STEP=1 $B/gpu-early2 --test-threads=1
  grep -E "^test result|step preset device-host|panicked" /tmp/gpu_early2.log | head -8
  step selftest 60 $B/mg-early2 selftest --backend cuda --out /tmp/selftest
  grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -3
  cp /tmp/selftest/summary.md "$OUT/selftest-cuda-summary.md" 2>/dev/null
  for v in early2 pdl; do ncu_b1 ncu-b1-$v 45 $B/mg-$v; done
  shape_cols 8; shape_rows 2; shape_rows 4; shape_cols 2; shape_cols 4
fi
tar czf $OUT/early-$part.tgz -C /tmp $(cd /tmp && ls gpu_*.log selftest.log b1-*.log b8-*.log shape-*.log 2>/dev/null) \
  $(cd /tmp && ls -d shape-b* shape-t* 2>/dev/null | grep -v log)
echo "done in $(( $(date +%s)-STEPS_START ))s"
