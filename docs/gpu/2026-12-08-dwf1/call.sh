#!/usr/bin/env bash
# One call for the next H200 (prepared 2026-12-08, twenty-ninth session, no device lent): issue 27's
# done-means table of main first (remeasure.sh SHORT: b1 with the PyTorch anchor, ncu, the target
# table, the whole GPU binary, selftest), then dwf1 against main on the same card (b1 interleaved,
# two rounds; dwf1's cuda_step:: module with the step-preset gate and its cuda_launch:: module; b8
# of both: dwf1 must leave it alone), then the read ceiling with what is left.
#   bash docs/gpu/2026-12-08-dwf1/call.sh S   carry ["target-g"] with mg-main, gpu-main, mg-dwf1, gpu-dwf1
# (README.md beside this file says how to build them.)
set -uo pipefail
source scripts/gpu/libs.sh
call_start dwf1 "${1:-560}"
SHORT=1 bash scripts/gpu/remeasure.sh "$(( $(left) - 200 ))"
for r in 0 1; do for v in main dwf1; do bench_step "d-$v-$r" "target-g/mg-$v" 1; done; done
step_module dwf1 70
step gpu_dwf1_launch 40 target-g/gpu-dwf1 --test-threads=1 cuda_launch::
grep -E "^test result|panicked|ahead of the wait" -A2 /tmp/gpu_dwf1_launch.log | head -6
for v in main dwf1; do bench_step "d-$v-b8" "target-g/mg-$v" 8; done
seam_table d-
for b in /tmp/d-*.log; do echo "$(basename "$b" .log): $(layer_rows "$b")"; done
read_ceiling 40 "copy|stream U=8|bpl|variant"
pack_logs dwf1.tgz 'd-*' 'gpu_dwf1*.log' 'read_*.log'
echo "done in $(( $(date +%s)-STEPS_START ))s"
