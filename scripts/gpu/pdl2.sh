#!/usr/bin/env bash
# Programmatic dependent launch without the L2 prefetches (branch pdl2: every kernel opens with
# kernel_entry(), the runtime launches with programmatic stream serialization on sm_90+), against
# main in the same call (ninth session, 2026-12-05). Carry target-g/ (stripped, built on the dev
# machine): mg-main / gpu-main = main at c2a95ce (its digest fold first runs on a GPU here),
# mg-pdl / gpu-pdl = pdl2. Call 1 of docs/gpu/2026-12-05-pdl2/ ran it (as `pdl2.sh 560`; today
# `bash scripts/gpu/pdl2.sh 1 560`, S = 560 the seconds the steps may take): b1 and b8 of main and pdl2 interleaved, pdl2's whole GPU binary,
# selftest, main's whole GPU binary. pdl2 landed on it; what follows it is scripts/gpu/early.sh.
set -uo pipefail
source scripts/gpu/libs.sh
part=${1:-1}
call_start pdl2-$part "${2:-565}"
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
