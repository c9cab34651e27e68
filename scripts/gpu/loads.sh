#!/usr/bin/env bash
# The latency changes that paid on 2026-12-05 (eighth session, call 1 on one H100: the experts'
# L2 round-ahead and the entry prefetches lost, see docs/gpu/2026-12-05-loads/), alone on main: one
# call of about 9 minutes (timeout_s 600). Carry target-f/ (about 24 MB, stripped, built on the dev
# machine): mg-a = main at 2682edd (target-next/mg-head), mg-f and gpu-f = branch `loads` (main +
# attention's batched key/value loads, the digests' batched loads, router top-k's sorted lane codes).
# Argument: the seconds the steps may take (default 565). f lands if gpu-f passes (with the
# step-preset gate) and its b1 layer beats a's in both rounds (it did: docs/gpu/2026-12-05-loads/).
set -uo pipefail
source scripts/gpu/libs.sh
call_start loads "${1:-565}"
for round in 0 1; do
  for v in a f; do bench_step b1-$v-$round target-f/mg-$v 1; done
done
step gpu_f 200 env MEMRA_GPU_STEP=1 target-f/gpu-f --test-threads=1
grep -E "^test result|step preset device-host|panicked" /tmp/gpu_f.log | head -8
for v in a f; do bench_step b8-$v target-f/mg-$v 8; done
step selftest 60 target-f/mg-f selftest --backend cuda --out /tmp/selftest
grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -3
cp /tmp/selftest/summary.md "$OUT/selftest-cuda-summary.md" 2>/dev/null
for v in f a; do ncu_b1 ncu-b1-$v 45 target-f/mg-$v; done
tar czf $OUT/loads.tgz -C /tmp $(cd /tmp && ls b1-*.log b8-*.log gpu_f.log selftest.log 2>/dev/null)
echo "done in $(( $(date +%s)-STEPS_START ))s"
