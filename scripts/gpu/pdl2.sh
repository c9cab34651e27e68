#!/usr/bin/env bash
# Programmatic dependent launch without the L2 prefetches (branch pdl2: every kernel opens with
# kernel_entry(), the runtime launches with programmatic stream serialization on sm_90+), against
# main in the same call (ninth session, 2026-12-05). Carry target-g/ (stripped, built on the dev
# machine): mg-main / gpu-main = main at c2a95ce (its digest fold first runs on a GPU here),
# mg-pdl / gpu-pdl = pdl2, mg-early / gpu-early = branch early (measurement only). Two calls of about 9 minutes each (timeout_s 600):
#   bash scripts/gpu/pdl2.sh 1 [S]   b1 and b8 of main and pdl2 interleaved, pdl2's whole GPU binary,
#                                    selftest, main's whole GPU binary (S: seconds the steps may take)
#   bash scripts/gpu/pdl2.sh 2 [S]   pdl2's `cuda_launch::` again (its host anchor fixed after call
#                                    1), ncu of one b1 bench, issue 24's shape table: rows B = 1, 2,
#                                    4, 8 with the PyTorch anchor at the same batch (its fastest
#                                    honest form), columns T = 2, 4, 8 (the anchor times rows only)
# pdl2 lands if gpu-pdl passes (with the step-preset gate and `cuda_launch::`) and its b1 layer
# beats main's in both rounds.
set -uo pipefail
source scripts/gpu/libs.sh
part=${1:-1}
gpu_call pdl2-$part
gpu_tools
steps_start "${2:-565}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
if [ "$part" = 2 ]; then
  step gpu_launch 120 target-g/gpu-pdl --test-threads=1 cuda_launch::
  grep -E "^test result|^test cuda_launch|panicked" /tmp/gpu_launch.log | head -6
  # Measurement only: branch early (pdl2 + the BF16 GEMVs' first weight vectors copied by cp.async
  # before the wait) against pdl2, interleaved, and early's GEMV twins and step-preset gate.
  for round in 0 1; do
    for v in pdl early; do bench_step b1-$v-$round target-g/mg-$v 1; done
  done
  step gpu_early 90 env MEMRA_GPU_STEP=1 target-g/gpu-early --test-threads=1 \
    cuda_step::batched_and_small_gemvs_match_twins cuda_step::step_preset_device_host_gate
  grep -E "^test result|step preset device-host|panicked" /tmp/gpu_early.log | head -4
  # Most important first (the steps' deadline skips the rest): b1 and b8 with the anchor, t8, then
  # b2, b4, t2, t4, and ncu of one b1 bench.
  shape_rows() {
    step shape-b$1 100 target-g/mg-pdl bench --backend cuda --preset step --layers 2 --graph --batch $1 \
      --out /tmp/shape-b$1
    grep -E "per token|fastest form|overhead" /tmp/shape-b$1.log | head -4
  }
  shape_cols() {
    step shape-t$1 40 target-g/mg-pdl bench --backend cuda --preset step --layers 2 --graph --no-torch \
      --columns $1 --out /tmp/shape-t$1
    grep -E "per token" /tmp/shape-t$1.log | head -2
  }
  shape_rows 1; shape_rows 8; shape_cols 8; shape_rows 2; shape_rows 4; shape_cols 2; shape_cols 4
  ncu_b1 ncu-b1-pdl 45 target-g/mg-pdl
  tar czf $OUT/pdl2-2.tgz -C /tmp $(cd /tmp && ls gpu_launch.log gpu_early.log b1-*.log shape-*.log 2>/dev/null) \
    $(cd /tmp && ls -d shape-b* shape-t* 2>/dev/null | grep -v log)
  echo "done in $(( $(date +%s)-STEPS_START ))s"
  exit 0
fi
for round in 0 1; do
  for v in main pdl; do bench_step b1-$v-$round target-g/mg-$v 1; done
done
step gpu_pdl 200 env MEMRA_GPU_STEP=1 target-g/gpu-pdl --test-threads=1
grep -E "^test result|step preset device-host|panicked" /tmp/gpu_pdl.log | head -8
grep -E "^test cuda_launch" /tmp/gpu_pdl.log | head -4
for v in main pdl; do bench_step b8-$v target-g/mg-$v 8; done
step serialized 40 target-g/mg-pdl bench --backend cuda --preset step --layers 2 --graph --no-torch --batch 1 \
  --serialized-launches --out /tmp/serialized
echo "b1-pdl-serialized: $(bench_summary /tmp/serialized.log)"
step selftest 60 target-g/mg-pdl selftest --backend cuda --out /tmp/selftest
grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -3
cp /tmp/selftest/summary.md "$OUT/selftest-cuda-summary.md" 2>/dev/null
step gpu_main 200 env MEMRA_GPU_STEP=1 target-g/gpu-main --test-threads=1
grep -E "^test result|step preset device-host|panicked" /tmp/gpu_main.log | head -8
tar czf $OUT/pdl2.tgz -C /tmp $(cd /tmp && ls b1-*.log b8-*.log serialized.log gpu_*.log selftest.log 2>/dev/null)
echo "done in $(( $(date +%s)-STEPS_START ))s"
