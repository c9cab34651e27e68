#!/usr/bin/env bash
# Programmatic dependent launch (seventh session, 2026-12-05), one call of about 7 minutes.
# Carry target-pdl/ (about 33 MB), each binary `strip`ped, built on the dev machine:
#   mg-a   main at 2682edd (target-next/mg-head: plain launches);
#   mg-b   every kernel opens with `kernel_entry()` (griddepcontrol.wait, then
#          launch_dependents) and the runtime launches with programmatic stream serialization;
#   mg-c   b + an L2 prefetch of the block's weight rows before the wait in the BF16 GEMVs
#          (`kernel_entry_prefetch`) + rmsnorm's weights loaded in the same round trip as its row;
#   gpu-c  c's GPU test binary (`cargo test --release -p memra-runtime --test gpu --no-run`).
# Steps: b1 and b8 benches of a, b, c interleaved (two rounds), c's whole GPU test binary with the
# step-preset device-host gate, `selftest --backend cuda` on c, ncu of c's b1.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call pdl
gpu_tools
steps_start "${1:-560}"
for round in 0 1; do
  for v in a b c; do
    bench_step b1-$v-$round target-pdl/mg-$v 1
  done
  for v in a c; do
    bench_step b8-$v-$round target-pdl/mg-$v 8
  done
done
step gpu_c 220 env MEMRA_GPU_STEP=1 target-pdl/gpu-c --test-threads=1
grep -E "^test result|step preset device-host|panicked" /tmp/gpu_c.log | head -8
step selftest 60 target-pdl/mg-c selftest --backend cuda --out /tmp/selftest
grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -3
ncu_b1 ncu-b1-c 60 target-pdl/mg-c
tar czf $OUT/pdl.tgz -C /tmp $(cd /tmp && ls b1-*.log b8-*.log gpu_c.log selftest.log run.log 2>/dev/null)
cp /tmp/selftest/summary.md "$OUT/selftest-cuda-summary.md" 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
