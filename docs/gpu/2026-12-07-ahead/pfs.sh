#!/usr/bin/env bash
# Weights ahead, three forms against main (twenty-fifth session): per-thread `prefetch.global.L2`
# issued by the window's first kernel right after its wait (pf3a) or after its own work (pf3b),
# and the bulk prefetch in a kernel of its own forked onto a side stream (side.patch: nothing on the
# rank's stream waits for it). Main interleaved; then the side build's
# no-bit-changed test and the step-preset device-host gate with the side stream on.
#   bash docs/gpu/2026-12-07-ahead/pfs.sh S   carry ["target-g"] with mg-main, mg-pf3a, mg-pf3b, mg-side, gpu-side
set -uo pipefail
source scripts/gpu/libs.sh
call_start pfs "${1:-330}"
for r in 0 1; do
  bench_step "b1-main-$r" target-g/mg-main 1
  for v in side pf3b pf3a; do bench_step "b1-$v-on-$r" "target-g/mg-$v" 1; done
done
bench_step "b1-side-off-0" target-g/mg-side 1 --no-weights-ahead
seam_table b1-
for b in /tmp/b1-*.log; do echo "$(basename "$b" .log): $(bench_summary "$b")"; done
step gpu_side_launch 40 target-g/gpu-side --test-threads=1 cuda_launch::weights_ahead
grep -E "^test result|weights ahead into L2|panicked" -A3 /tmp/gpu_side_launch.log | head -6
step gpu_side_step 60 target-g/gpu-side --test-threads=1 cuda_step::
grep -E "^test result|panicked" -A3 /tmp/gpu_side_step.log | head -6
pack_logs pfs.tgz 'b1-*' 'gpu_*.log'
echo "done in $(( $(date +%s)-STEPS_START ))s"
